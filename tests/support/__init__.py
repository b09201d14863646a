"""Helpers the test suites share: real servers, SDK type checks, stores, GGUF writers.

Conftest files keep only fixtures; anything a test imports lives here."""
