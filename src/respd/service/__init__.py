"""Responses semantics: translation, context fitting, output parsing and the event machine.

Nothing here knows HTTP or a particular engine.
"""
