"""The README's quick start, run as a newcomer runs it, against a real server: its curl
commands and its Python example, several times each, every run
ending complete."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from openai.types.responses import Response

from tests.support.sdk_types import strict_event
from tests.support.servers import RespdServer

README = Path(__file__).resolve().parents[2] / "README.md"
DEFAULT_URL = "http://127.0.0.1:8080"
RUNS = 4


def quick_start_blocks(lang: str) -> list[str]:
    """The fenced `lang` blocks of the README's Quick start section."""
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def curl_commands() -> list[list[str]]:
    """The sh block's commands, split as a shell would (quotes may span lines)."""
    [block] = quick_start_blocks("sh")
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    commands: list[list[str]] = []
    for word in words:
        if word == "curl":
            commands.append([])
        commands[-1].append(word)
    return commands


def test_the_quick_start_has_the_examples_this_test_runs() -> None:
    commands = curl_commands()
    assert len(commands) == 2 and all(c[0] == "curl" for c in commands)
    [python] = quick_start_blocks("python")
    assert "responses.stream" in python and "chat.completions.create" in python


@pytest.mark.parametrize("run", range(RUNS))
def test_readme_curl_commands_complete(server: RespdServer, run: int) -> None:
    plain, streamed = curl_commands()
    for cmd in (plain, streamed):
        argv = [a.replace(DEFAULT_URL, server.base_url) for a in cmd]
        out = subprocess.run(
            [*argv, "--silent", "--show-error", "--max-time", "120"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if cmd is plain:
            resp = Response.model_validate(json.loads(out))
            assert resp.status == "completed" and resp.output_text, out
        else:
            data = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
            events = [strict_event(json.loads(d)) for d in data]
            # The stream ends with its terminal event. The embedded model at temperature 0
            # may count on past five up to the default output cap: then the response is
            # incomplete, for that cap, after its text streamed.
            last = events[-1]
            assert last.type in ("response.completed", "response.incomplete"), last
            if last.type == "response.incomplete":
                details = last.response.incomplete_details
                assert details is not None and details.reason == "max_output_tokens", last
            assert any(e.type == "response.output_text.delta" for e in events)


@pytest.mark.parametrize("run", range(RUNS))
def test_readme_python_example_completes(server: RespdServer, run: int) -> None:
    [source] = quick_start_blocks("python")
    source = source.replace(DEFAULT_URL, server.base_url)
    scope: dict[str, object] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, str(README), "exec"), scope)
    resp, final, chat = scope["resp"], scope["final"], scope["chat"]
    assert resp.status == "completed"
    assert final.status == "completed" and final.output_text
    assert chat.choices[0].finish_reason == "stop"
    assert printed.getvalue().strip()
