"""How llama.cpp's idle decode threads wait for work: ggml's threads use OpenMP, whose wait
policy is read from the environment once, when llama.cpp loads. A module of its own, so that
`respd serve` can set it from `--poll` before anything loads llama.cpp."""

from __future__ import annotations

import os

from respd.engines.defaults import POLL

POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def wait_policy_env(poll: int) -> dict[str, str]:
    """The OpenMP settings llama-server's `--poll` (0-100) stands for."""
    if poll == 0:
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    # Spins before a waiting thread sleeps; libgomp's own default, 300,000, is --poll 100.
    return {"GOMP_SPINCOUNT": str(poll * 3000)}


def apply_wait_policy(poll: int) -> None:
    """Put `wait_policy_env(poll)` in this process's environment where it does not set
    them already."""
    for name, value in wait_policy_env(poll).items():
        os.environ.setdefault(name, value)


def default_wait_policy() -> None:
    """`--poll`'s default for code that loads llama.cpp without `respd serve` (a library
    user building the engine, a test): unless the environment chose a policy already.
    OpenMP's own default spins, and two such processes on the same cores each ran ten times
    slower than alone."""
    if not any(name in os.environ for name in POLICY_VARIABLES):
        apply_wait_policy(POLL)
