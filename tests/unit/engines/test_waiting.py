"""The OpenMP wait policy that code loading llama.cpp without `respd serve` gets: `--poll`'s
default, unless the environment (or `respd serve`'s `--poll`) chose one already."""

from __future__ import annotations

import os

import pytest

from respd.engines.waiting import POLICY_VARIABLES, default_wait_policy


@pytest.fixture()
def clean(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in POLICY_VARIABLES:
        monkeypatch.setenv(name, "x")  # recorded, so the test's writes are undone
        monkeypatch.delenv(name)
    return monkeypatch


def test_an_unset_policy_becomes_poll_s_default(clean: pytest.MonkeyPatch) -> None:
    default_wait_policy()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize("name", POLICY_VARIABLES)
def test_a_chosen_policy_is_left_alone(clean: pytest.MonkeyPatch, name: str) -> None:
    clean.setenv(name, "150000" if name == "GOMP_SPINCOUNT" else "ACTIVE")
    default_wait_policy()
    assert [n for n in POLICY_VARIABLES if n in os.environ] == [name]
