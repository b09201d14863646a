"""Decide, before generating, how tools and an answer format shape one request.

From the offered tools, the `ToolPolicy` and the requested answer schema this computes which
tools the model is shown, the engine-neutral `Constraint` its output must satisfy, and how
many calls the output reader accepts. Both APIs call `plan_output`, so their behaviour
cannot drift apart.

| tool_choice           | tools shown      | constraint                                     |
|-----------------------|------------------|------------------------------------------------|
| auto                  | all / allowed    | none, or `calls | answer` with a schema        |
| none                  | none             | the answer schema, if any                      |
| required / named /    | permitted ones   | one or more calls to a permitted function      |
| allowed_tools required|                  | (at most `max_tool_calls`; 1 if not parallel)  |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from respd.engines.base import ToolDefinition
from respd.engines.constraints import CallsConstraint, Constraint
from respd.protocol.errors import InvalidRequest
from respd.service.tools.definitions import ToolPolicy


@dataclass(frozen=True)
class OutputPlan:
    tools: list[ToolDefinition]  # what the model is shown
    constraint: Constraint | None
    max_calls: int | None  # calls the reader accepts (None: any)


def plan_output(
    tools: list[ToolDefinition],
    policy: ToolPolicy,
    answer_schema: dict[str, Any] | None,
    *,
    answer_param: str,
    choice_param: str = "tool_choice",
) -> OutputPlan:
    """`answer_schema`: the JSON Schema a text answer must follow (json_object: any object)."""
    offered = [] if policy.mode == "none" else list(tools)
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
    cap = policy.call_cap()
    calls = CallsConstraint(tuple(offered), cap) if offered else None
    constraint = None
    if forced:
        constraint = Constraint(calls=calls)
    elif answer_schema is not None:
        constraint = Constraint(calls=calls, answer=answer_schema)
    return OutputPlan(offered, constraint, cap)
