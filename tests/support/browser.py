"""Debian's Chromium, driven by Playwright, for the playground's browser tests.

Playwright's own browser downloads are never used: the tests launch the system Chromium
(`apt-get install chromium`) by path, with the flags that keep it from reaching for the
network (this machine refuses outside connections, and a test should not depend on them)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_ENV = "RESPD_TEST_CHROMIUM"
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
INSTALL_HINT = "apt-get install -y --no-install-recommends chromium chromium-driver"


def chromium_path() -> Path:
    """The Chromium binary: $RESPD_TEST_CHROMIUM, else `chromium` on PATH. Without one the
    browser tests fail under CI (`.ci/run` installs it) and skip elsewhere."""
    found = os.environ.get(CHROMIUM_ENV) or shutil.which("chromium")
    if found and Path(found).is_file():
        return Path(found)
    if os.environ.get("CI"):
        pytest.fail(f"no Chromium found: .ci/run installs it with `{INSTALL_HINT}`")
    pytest.skip(f"the browser tests need Chromium: `{INSTALL_HINT}` (or set {CHROMIUM_ENV})")
