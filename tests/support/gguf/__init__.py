"""Tiny, real GGUF models and projectors written with `gguf` for the vision tests."""
