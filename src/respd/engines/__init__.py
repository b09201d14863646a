"""Engines turn a conversation into tokens and tokens into generated text.

`base.py` holds the narrow protocol; each implementation lives in its own module.
"""
