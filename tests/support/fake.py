"""The in-process app over the package's `FakeEngine` (the unit suite's, no model)."""

from __future__ import annotations

FAKE_MODEL = "fake-model"
