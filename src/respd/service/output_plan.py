"""Decide, before generating, how tools and output formats shape one request.

From the tools, the `ToolPolicy` and the requested answer format this computes what the
template renders (which tools, and the conversation rewritten for templates without tool
support), the grammar the sampler must follow, and how the output is read back. Both APIs
call `plan_output`, so their behaviour cannot drift apart.

| tool_choice          | tools rendered   | grammar                                   |
|----------------------|------------------|-------------------------------------------|
| auto                 | all / allowed    | none, or `calls | answer` with a schema   |
| none                 | none             | the answer schema, if any                 |
| required / named /   | permitted ones   | one or more calls to a permitted function |
| allowed_tools required|                 | (at most `max_tool_calls`; 1 if not parallel) |
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from respd.engines.base import ChatMessage
from respd.protocol.errors import InvalidRequest
from respd.service.constraints import GrammarBuilder, SchemaRejected, reasoning_first_grammar
from respd.service.reasoning import ReasoningPlan
from respd.service.tool_formats import ToolFormat, detect_format, generic_messages
from respd.service.tool_parsing import ToolCallParser
from respd.service.tools import FunctionTool, ToolPolicy


@dataclass
class OutputPlan:
    messages: list[ChatMessage]  # as the template should see them
    template_tools: list[dict[str, Any]] | None  # the template's `tools` variable
    grammar: str | None
    fmt: ToolFormat | None  # None: the output is all text
    names: frozenset[str] = field(default_factory=frozenset)
    max_calls: int | None = None

    def parser(self) -> ToolCallParser | None:
        if self.fmt is None:
            return None
        return ToolCallParser(self.fmt, set(self.names), self.max_calls)


def plan_output(
    template_source: str,
    messages: list[ChatMessage],
    tools: list[FunctionTool],
    policy: ToolPolicy,
    *,
    answer_schema: dict[str, Any] | None,
    answer_param: str,
    choice_param: str = "tool_choice",
) -> OutputPlan:
    """`answer_schema`: the JSON Schema a text answer must follow (json_object: any object)."""
    fmt, native = detect_format(template_source)
    offered = [] if policy.mode == "none" else tools
    if policy.allowed is not None:
        offered = [t for t in offered if t.name in policy.allowed]
    forced = policy.mode == "required"
    if forced and answer_schema is not None:
        raise InvalidRequest(
            f"A forced tool_choice cannot be combined with a JSON schema in '{answer_param}': "
            "each would constrain the whole output.",
            param=choice_param,
            code="invalid_value",
        )
    template_tools = [t.as_template_tool() for t in offered] or None
    if not native:
        messages = generic_messages(messages, template_tools)
        template_tools = None
    cap = policy.call_cap()
    builder = GrammarBuilder()
    grammar: str | None = None
    try:
        calls = (
            builder.calls_rule(fmt, [(t.name, t.parameters) for t in offered], cap)
            if offered and (forced or answer_schema is not None)
            else None
        )
    except SchemaRejected as exc:
        raise InvalidRequest(
            f"A tool's parameters cannot be enforced: {exc}.",
            param="tools",
            code="invalid_function_parameters",
        ) from exc
    try:
        answer = builder.schema_rule(answer_schema, "answer") if answer_schema is not None else None
    except SchemaRejected as exc:
        raise InvalidRequest(
            f"Invalid schema in '{answer_param}': {exc}.", param=answer_param, code="invalid_value"
        ) from exc
    if forced:
        assert calls is not None
        grammar = builder.build(calls)
    elif answer is not None:
        grammar = builder.build(*([calls] if calls else []), answer)
    return OutputPlan(
        messages,
        template_tools,
        grammar,
        fmt if offered else None,
        frozenset(t.name for t in offered),
        cap,
    )


# How much thinking a constrained answer may be preceded by, in characters, per effort.
THINKING_CHARS = {"minimal": 128, "low": 512, "medium": 2048, "high": 8192}
DEFAULT_THINKING_CHARS = 2048


def with_reasoning(
    plan: OutputPlan, reasoning: ReasoningPlan | None, effort: str | None
) -> OutputPlan:
    """A grammar on a prompt that primes an open thinking block first lets the model finish
    thinking (bounded by `effort`, so it always gets to the answer) and write the close
    marker; the answer the grammar constrains comes after it. Otherwise the plan stands."""
    if plan.grammar is None or reasoning is None or not reasoning.primed:
        return plan
    if reasoning.style.answer_headers:  # gpt-oss's channels: not constrained here
        return plan
    chars = THINKING_CHARS.get((effort or "").strip().lower(), DEFAULT_THINKING_CHARS)
    return replace(
        plan, grammar=reasoning_first_grammar(plan.grammar, reasoning.style.close, chars)
    )
