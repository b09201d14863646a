"""The SDK types respd sends are built when the app starts, not by its first requests."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter: the SDK defers each type's build to its first use, so this shows
# them unbuilt before the app's startup and built after it.
SCRIPT = """
from typing import get_args
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from respd.api.app import create_app
from respd.engines.fake import FakeEngine

types = (Response, ChatCompletion, ChatCompletionChunk, *get_args(get_args(ResponseStreamEvent)[0]))
app = create_app(FakeEngine())
print(sum(not t.__pydantic_complete__ for t in types), len(types))
with TestClient(app):
    print(sum(not t.__pydantic_complete__ for t in types))
"""


def test_the_app_builds_the_sdk_types_at_startup() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    before, total, after = (int(x) for x in out.stdout.split())
    assert before == total > 60, out.stdout  # none built by importing or creating the app
    assert after == 0, out.stdout
