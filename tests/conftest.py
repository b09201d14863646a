"""Hypothesis profiles for every suite, loaded before any test module builds its settings.

`quick` (the default) runs a few dozen examples per property: enough where a property is
also pinned by example tests or parametrized over many cases. `thorough` runs the full
search; choose it with HYPOTHESIS_PROFILE=thorough or `--hypothesis-profile=thorough`.
Tests that name their own `max_examples` keep it under either profile."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("quick", max_examples=30)
settings.register_profile("thorough", max_examples=150)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
