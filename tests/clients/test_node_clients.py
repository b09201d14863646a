"""The npm clients — the `openai` Node SDK, the Vercel AI SDK and the OpenAI Agents SDK for
JavaScript — each flow a `node run.mjs CLIENT FLOW` process against respd (tests/clients/node).

The flows run on the Node.js the lockfile installs (the `node` package), the version those
clients support, not whatever Node the machine happens to have."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.clients.capture import CaptureProxy
from tests.clients.matrix import NODE_DIR
from tests.support.servers import MODEL_ID

FLOWS = {
    "openai-node": ["create", "stream", "function-tools", "zod-text-format", "conversations"],
    "vercel-ai": ["generate-text", "stream-text", "tool-loop", "generate-object"],
    "agents-js": ["two-tools", "handoff", "session", "streamed"],
}
# The endpoint each client's flows must have used: the Responses API, not Chat Completions.
RESPONSES = "/v1/responses"


def run_node(node_modules: Path, *args: str, env: dict[str, str] | None = None) -> str:
    node = node_modules / ".bin" / "node"
    done = subprocess.run(
        [str(node), "run.mjs", *args],
        cwd=NODE_DIR,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"node run.mjs {' '.join(args)} failed:\n{done.stderr[-6000:]}"
    return done.stdout


def test_the_flow_list_is_the_scripts_own(node_modules: Path) -> None:
    assert json.loads(run_node(node_modules, "--list").strip().splitlines()[-1]) == FLOWS


@pytest.mark.parametrize(
    ("client", "name"),
    [
        pytest.param(c, f, marks=pytest.mark.flow(c, f), id=f"{c}-{f}")
        for c, flows in FLOWS.items()
        for f in flows
    ],
)
def test_node_flow(
    client: str, name: str, flow: tuple[str, str], node_modules: Path, proxy: CaptureProxy
) -> None:
    out = run_node(
        node_modules,
        client,
        name,
        env={"RESPD_BASE_URL": proxy.base_url(client), "RESPD_MODEL": MODEL_ID},
    )
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ok"] is True, summary
    paths = [r.path for r in proxy.seen(client, name)]
    assert any(p.startswith(RESPONSES) for p in paths), paths
    assert not any(p.startswith("/v1/chat/completions") for p in paths), paths
