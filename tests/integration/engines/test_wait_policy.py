"""A process that loads the llama.cpp engine as a library (no `respd serve`, no `--poll`)
gets `--poll`'s default wait policy before llama.cpp's OpenMP runtime reads it: with
OpenMP's spinning default, two such processes on the same cores each ran ten times slower."""

from __future__ import annotations

import os
import subprocess
import sys

from respd.engines.waiting import POLICY_VARIABLES

SCRIPT = """
import os, sys
import respd.engines.llamacpp
assert "llama_cpp" in sys.modules
print(os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
"""


def _policy(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in POLICY_VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.split()


def test_importing_the_engine_sets_the_passive_policy() -> None:
    assert _policy() == ["PASSIVE", "None"]


def test_a_policy_chosen_before_is_kept() -> None:
    assert _policy(GOMP_SPINCOUNT="150000") == ["None", "150000"]
