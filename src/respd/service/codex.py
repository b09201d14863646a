"""What OpenAI's Codex CLI asks a provider about its models.

Codex fetches `GET /v1/models?client_version=…` and reads `{"models": [model info]}`: per
model its context window, the reasoning levels it takes, which shell and patch tools to
offer it, how far to truncate tool output, and the instructions to start each session with.
Without this answer Codex falls back to metadata made for OpenAI's models (a 272k-token
window, a system prompt of about 4,000 tokens, no apply_patch tool), so a local model would
need a hand-written catalog file. Each entry here is derived from what the engine knows of
its model, so the catalog is always the one the server actually serves.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from respd.engines.base import Engine

# Short on purpose: the instructions open every Codex session and a small model's context
# window is a few thousand tokens. Codex describes its tools itself.
CODEX_INSTRUCTIONS = (
    "You are Codex, a coding agent working in the user's terminal. To run a shell command, "
    "call exec_command; to create or edit files, call apply_patch. Keep answers short: after "
    "a tool answers, say in one sentence what it did or printed."
)
# Share of the context window Codex may fill before it compacts the session: the rest is
# left for the answer and the tools' output.
AUTO_COMPACT_SHARE = 0.8
# Tool output Codex keeps per call, in tokens: a quarter of the window, at most 10,000.
MAX_TRUNCATION_TOKENS = 10_000
_EFFORTS = (
    ("low", "Answers fast, thinks briefly."),
    ("medium", "Balances speed and depth."),
    ("high", "Thinks longest before answering."),
)


def instructions(engine: Engine) -> str:
    """The session's instructions; for a model whose calls this server reads from its text,
    with one call written in that model family's own format, which small models copy."""
    fmt = engine.profile.tool_format
    if fmt is None:
        return CODEX_INSTRUCTIONS
    call = json.dumps({"name": "exec_command", fmt.args_key: {"cmd": "date"}})
    example = f"{fmt.list_open}{fmt.call_open}{call}{fmt.call_close}{fmt.list_close}"
    return f"{CODEX_INSTRUCTIONS} Example: asked to run date, you reply\n{example}"


def _reasoning(engine: Engine) -> dict[str, Any]:
    """A model that thinks takes Codex's effort levels; one that does not, none."""
    if engine.profile.reasoning is None:
        return {
            "default_reasoning_level": None,
            "supported_reasoning_levels": [],
            "supports_reasoning_summaries": False,
            "default_reasoning_summary": "none",
        }
    return {
        "default_reasoning_level": "medium",
        "supported_reasoning_levels": [{"effort": e, "description": d} for e, d in _EFFORTS],
        "supports_reasoning_summaries": True,
        "default_reasoning_summary": "auto",
    }


def model_info(engine: Engine, priority: int = 0) -> dict[str, Any]:
    """One model as Codex's `ModelInfo` reads it (Codex 0.171's field set)."""
    window = engine.context_window
    return {
        "slug": engine.model_id,
        "display_name": engine.model_id,
        "description": f"{engine.model_id}, served by respd.",
        "base_instructions": instructions(engine),
        **_reasoning(engine),
        "shell_type": "unified_exec",
        "visibility": "list",
        "supported_in_api": True,
        "priority": priority,
        "additional_speed_tiers": [],
        "service_tiers": [],
        "availability_nux": None,
        "upgrade": None,
        "include_skills_usage_instructions": False,
        "include_plugin_usage_instructions": False,
        "include_apps_usage_instructions": False,
        "support_verbosity": False,
        "default_verbosity": None,
        # respd holds a custom tool's input to its Lark grammar while sampling
        "apply_patch_tool_type": "freeform",
        "web_search_tool_type": "text",
        "truncation_policy": {
            "mode": "tokens",
            "limit": min(MAX_TRUNCATION_TOKENS, window // 4),
        },
        # one call per turn: what a small local model follows best
        "supports_parallel_tool_calls": False,
        "supports_image_detail_original": False,
        "context_window": window,
        "max_context_window": window,
        "auto_compact_token_limit": int(window * AUTO_COMPACT_SHARE),
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "input_modalities": ["text", "image"] if engine.vision else ["text"],
        "supports_search_tool": False,
        "use_responses_lite": False,
    }


def codex_catalog(engines: Iterable[Engine]) -> dict[str, Any]:
    """The `ModelsResponse` Codex reads: every model served, the first one first."""
    return {"models": [model_info(engine, i) for i, engine in enumerate(engines)]}
