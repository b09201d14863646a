"""OpenAI's Codex CLI (`@openai/codex` from npm, its binary inside the package) driving
respd as a custom Responses provider: `codex exec` sessions that answer, run a shell
command through its `exec_command` function tool, edit a file through its freeform
`apply_patch` custom tool (a Lark grammar), and compact a resumed session server-side
(`compaction_trigger`). Each session must end normally (exit status 0).

Codex is configured as docs/clients/codex.md shows (tests/clients/codex): respd as a
provider with a token command, so Codex asks respd for its model catalog (`GET
/v1/models?client_version=…`: the context window, short instructions, the freeform
apply_patch tool) instead of reading a catalog file, and no sub-agent or goal tools. The
135M model is greedy here
(`--temperature 0`) and is told exactly which call to write; what is tested is the
protocol: every request Codex sends is accepted, its calls come back as the items Codex
executes, and their outputs go back in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.capture import (
    FIXTURE_STATE_KEY,
    Captured,
    CaptureProxy,
    RunningProxy,
    save_fixtures,
)
from tests.clients.matrix import NODE_DIR
from tests.support.servers import RespdServer, start_server

CODEX_DIR = Path(__file__).with_name("codex")
CODEX = str(NODE_DIR / "node_modules" / ".bin" / "codex")
SHELL = json.dumps({"name": "exec_command", "arguments": {"cmd": "echo hello > out.txt"}})
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
APPLY = json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}})


@pytest.fixture(scope="module")
def codex_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("respd-codex"),
        "--ctx-size",
        "8192",
        "--threads",
        "2",
        "--temperature",
        "0",
        # Past its tool call the small model may ramble; this bounds how long.
        "--max-output-tokens",
        "200",
        # The flows were measured with plain greedy decoding: with DRY the 135M model
        # rambles past the tool's output into the bound, and Codex stops at an incomplete turn.
        "--dry-multiplier",
        "0",
        "--data-dir",
        str(tmp_path_factory.mktemp("respd-codex-data")),
        "--state-key",
        FIXTURE_STATE_KEY,
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture(scope="module")
def codex_proxy(codex_server: RespdServer) -> Iterator[CaptureProxy]:
    with RunningProxy(codex_server.base_url) as state:
        yield state
    if os.environ.get("RESPD_RECORD_CLIENT_FIXTURES") == "1":
        save_fixtures(state)


@pytest.fixture()
def codex(
    request: pytest.FixtureRequest,
    codex_proxy: CaptureProxy,
    node_modules: Path,
) -> Iterator[tuple[Path, list[Captured]]]:
    """A Codex home configured for respd and an empty workspace; yields the workspace and
    (after the flow) what Codex sent."""
    marker = request.node.get_closest_marker("flow")
    assert marker is not None
    codex_proxy.flow = marker.args[1]
    # One fixed path for every flow and run: Codex shows the model its working directory,
    # and the greedy 135M model's reply then depends on nothing that changes between runs.
    root = Path(tempfile.gettempdir()) / "respd-codex"
    shutil.rmtree(root, ignore_errors=True)
    home, work = root / "codex-home", root / "work"
    home.mkdir(parents=True)
    work.mkdir()
    config = (CODEX_DIR / "config.toml").read_text()
    config = config.replace("{base_url}", codex_proxy.base_url("codex"))
    (home / "config.toml").write_text(config)
    sent: list[Captured] = []
    yield work, sent
    codex_proxy.flow = ""


def run_codex(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`codex exec ARGS` in `work` (the last argument: the prompt)."""
    return subprocess.run(
        [CODEX, "exec", "--skip-git-repo-check", *args],
        cwd=work,
        env={**os.environ, "CODEX_HOME": str(work.parent / "codex-home")},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _call(call: str, *, lines: bool = False) -> str:
    """A call written the way the model's tool format reads it."""
    sep = "\n" if lines else ""
    return f"<tool_call>{sep}{call}{sep}</tool_call>"


def _requests(proxy: CaptureProxy, flow: str) -> list[Captured]:
    """The turns Codex sent (all answered 200), after it asked respd for its models."""
    seen = proxy.seen("codex", flow)
    assert seen, "Codex sent respd nothing"
    for r in seen:
        assert r.status == 200, f"{r.method} {r.path} answered {r.status}"
    discovery = [r for r in seen if r.method == "GET"]
    assert discovery, "Codex did not ask respd for its models"
    assert all(r.path == "/v1/models" and "client_version=" in r.query for r in discovery)
    turns = [r for r in seen if r.method == "POST"]
    assert all(r.path == "/v1/responses" for r in turns)
    return turns


def _input_types(r: Captured) -> list[str]:
    return [str(item.get("type", "message")) for item in r.body["input"]]


@pytest.mark.flow("codex", "answer")
def test_codex_answers(codex: tuple[Path, list[Captured]], codex_proxy: CaptureProxy) -> None:
    work, _ = codex
    done = run_codex(work, "What is 2+2? Answer in one short sentence.")
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip(), "the turn ended without an answer"
    (first,) = _requests(codex_proxy, "answer")
    assert "Model metadata" not in done.stderr  # the catalog respd served was used
    body = first.body
    assert body["store"] is False and body["stream"] is True
    assert "reasoning.encrypted_content" in body["include"]
    kinds = {t["type"] for t in body["tools"]}
    assert {"function", "custom", "web_search"} <= kinds  # custom: the freeform apply_patch


@pytest.mark.flow("codex", "exec-command")
def test_codex_runs_a_shell_command(
    codex: tuple[Path, list[Captured]], codex_proxy: CaptureProxy
) -> None:
    work, _ = codex
    done = run_codex(work, f"Reply with exactly this line and nothing else: {_call(SHELL)}")
    assert done.returncode == 0, done.stderr[-4000:]  # the session ended normally
    assert (work / "out.txt").read_text() == "hello\n"  # Codex ran the call respd returned
    sent = _requests(codex_proxy, "exec-command")
    assert len(sent) >= 2
    assert "function_call_output" in _input_types(sent[1])  # and sent its output back


@pytest.mark.flow("codex", "apply-patch")
def test_codex_applies_a_patch_through_its_freeform_tool(
    codex: tuple[Path, list[Captured]], codex_proxy: CaptureProxy
) -> None:
    work, _ = codex
    done = run_codex(work, f"Reply with exactly this and nothing else:\n{_call(APPLY, lines=True)}")
    assert done.returncode == 0, done.stderr[-4000:]
    assert (work / "hello.txt").read_text() == "hello\n"
    sent = _requests(codex_proxy, "apply-patch")
    assert len(sent) >= 2
    assert {"custom_tool_call", "custom_tool_call_output"} <= set(_input_types(sent[1]))


@pytest.mark.flow("codex", "compaction")
def test_codex_compacts_a_session_past_its_token_limit(
    codex: tuple[Path, list[Captured]], codex_proxy: CaptureProxy
) -> None:
    """A session with a tool call, then a resumed turn past a tiny auto-compaction limit:
    Codex compacts before the turn by sending the history with a final
    `compaction_trigger` item, installs the one `compaction` item respd streams back in
    place of the history, and answers on from it."""
    work, _ = codex
    first = run_codex(work, f"Reply with exactly this line and nothing else: {_call(SHELL)}")
    assert first.returncode == 0, first.stderr[-4000:]
    assert (work / "out.txt").read_text() == "hello\n"
    limit = "model_auto_compact_token_limit=50"
    resume = run_codex(work, "-c", limit, "resume", "--last", "What is 2+2?")
    assert resume.returncode == 0, resume.stderr[-4000:]
    assert "context compacted" in resume.stderr
    sent = _requests(codex_proxy, "compaction")
    triggers = [r for r in sent if _input_types(r)[-1] == "compaction_trigger"]
    assert len(triggers) == 1
    # the history it asked to compact is the first turn's, tool call and output included
    assert {"function_call", "function_call_output"} <= set(_input_types(triggers[0]))
    after = sent[sent.index(triggers[0]) + 1]
    assert "compaction" in _input_types(after)  # the item respd made, given back
    assert "function_call" not in _input_types(after)
