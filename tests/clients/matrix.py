"""The compatibility matrix: which client, at which version, passed which flow.

The client suite records every flow's result; `matrix.json` beside this file is the
committed record, and the manual's table (docs/clients/compatibility.md, between two marker
lines) is rendered from it, so the manual can only say what the suite last measured.
`RESPD_UPDATE_CLIENT_MATRIX=1` rewrites both from a full run of the suite."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

MATRIX_JSON = Path(__file__).with_name("matrix.json")
PAGE = Path(__file__).parents[2] / "docs" / "clients" / "compatibility.md"
BEGIN = "<!-- client-matrix:begin (generated from tests/clients/matrix.json) -->"
END = "<!-- client-matrix:end -->"
NODE_DIR = Path(__file__).with_name("node")
# The packages whose versions the matrix names, per client.
PACKAGES = {
    "openai-python": ["openai"],
    "agents-python": ["openai-agents"],
    "langchain": ["langchain-openai", "langchain-core"],
    "pydantic-ai": ["pydantic-ai-slim"],
    "litellm": ["litellm"],
    "openai-node": ["openai"],
    "vercel-ai": ["ai", "@ai-sdk/openai"],
    "agents-js": ["@openai/agents"],
    "codex": ["@openai/codex"],
}
NODE_CLIENTS = {"openai-node", "vercel-ai", "agents-js", "codex"}


@dataclass(frozen=True, order=True)
class FlowResult:
    client: str
    flow: str
    versions: str  # "package version, ..." as installed for the run
    result: str  # "pass" or "fail"


def load(path: Path = MATRIX_JSON) -> list[FlowResult]:
    if not path.exists():
        return []
    return sorted(FlowResult(**row) for row in json.loads(path.read_text()))


def save(results: list[FlowResult], path: Path = MATRIX_JSON) -> None:
    rows = [asdict(r) for r in sorted(results)]
    path.write_text(json.dumps(rows, indent=2) + "\n")


def render(results: list[FlowResult]) -> str:
    """A markdown table: one row per client, its versions, and each flow with its result."""
    by_client: dict[str, list[FlowResult]] = {}
    for r in sorted(results):
        by_client.setdefault(r.client, []).append(r)
    lines = ["| client | versions | flows |", "|---|---|---|"]
    for client, rows in by_client.items():
        flows = ", ".join(f"{r.flow} {'✅' if r.result == 'pass' else '❌'}" for r in rows)
        lines.append(f"| {client} | {rows[0].versions} | {flows} |")
    return "\n".join(lines)


def page_section(text: str) -> str:
    """The generated table as it stands in the page's text."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def write_page(results: list[FlowResult], page: Path = PAGE) -> None:
    text = page.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    page.write_text(text[:start] + "\n" + render(results) + "\n" + text[end:])


def versions(client: str) -> str:
    """What the matrix says about the client's installed packages."""
    parts = []
    for package in PACKAGES[client]:
        if client in NODE_CLIENTS:
            manifest = NODE_DIR / "node_modules" / package / "package.json"
            version = json.loads(manifest.read_text())["version"] if manifest.exists() else "?"
        else:
            try:
                version = metadata.version(package)
            except metadata.PackageNotFoundError:
                version = "?"
        parts.append(f"{package} {version}")
    return ", ".join(parts)
