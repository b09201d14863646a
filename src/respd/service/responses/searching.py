"""A response whose model may search for tools this server finds (hosted tool search).

One response, several passes of the model: a pass that ends with hosted `tool_search`
calls (and no call the client must run) gets each search's `tool_search_output` item,
then the model goes on in a new pass whose prompt holds the search and its result, and
whose tools include the ones found. Every pass writes into the same event machine, so the
client sees one response: its items in order, its usage the sum of the passes'. A pass
that cannot start (the prompt grew past the context, the engine is full) fails the
response, with the items so far kept.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from openai.types.responses import ResponseStreamEvent

from respd.engines.base import Engine
from respd.protocol.errors import APIError
from respd.service.generation import core
from respd.service.generation.core import ActiveRuns, GenerationSpec
from respd.service.generation.output import Finished, Started, Usage
from respd.service.ids import new_id
from respd.service.media.lowering import Lowering
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.translate import input_to_messages
from respd.service.tools.definitions import ToolRoute, responses_tools
from respd.service.tools.tool_search import (
    MAX_SEARCHES,
    SEARCH_NAME,
    SearchPlan,
    search,
    undeferred,
)

log = logging.getLogger(__name__)
JSON = dict[str, Any]
# The client-run calls that end a response whatever else the pass did.
_CLIENT_CALLS = frozenset(
    {"function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call"}
)


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.input_tokens + b.input_tokens,
        a.output_tokens + b.output_tokens,
        a.cached_tokens + b.cached_tokens,
        a.reasoning_tokens + b.reasoning_tokens,
    )


@dataclass
class SearchLoop:
    """What a new pass needs: the engine, the first pass's spec, the runs in flight, the
    deferred tools, and how many searches the response may run."""

    engine: Engine
    spec: GenerationSpec
    runs: ActiveRuns | None
    plan: SearchPlan
    max_searches: int = MAX_SEARCHES

    def searches(self, items: list[JSON]) -> list[JSON]:
        """The hosted searches a pass asked for, if the response goes on after it: none
        when it also called a tool the client runs."""
        if any(item["type"] in _CLIENT_CALLS for item in items):
            return []
        return [
            item
            for item in items
            if item["type"] == "tool_search_call"
            and item.get("execution") == "server"
            and item.get("status") == "completed"
        ]

    def output_item(self, call: JSON) -> JSON:
        arguments = call.get("arguments")
        found = search(arguments if isinstance(arguments, dict) else {}, self.plan.deferred)
        log.info("tool search %s found %d tools", arguments, len(found))
        return {
            "id": new_id("tso"),
            "type": "tool_search_output",
            "call_id": None,
            "execution": "server",
            "status": "completed",
            "tools": found,
        }

    def next_spec(
        self, spec: GenerationSpec, items: list[JSON], searched: int, routes: dict[str, ToolRoute]
    ) -> GenerationSpec:
        """The next pass: the conversation with this pass's items, the tools found added
        (their calls mapping back through `routes`); the search function itself left out
        once the response has searched enough."""
        lowering = Lowering(self.engine.model_id, self.engine.vision)
        added = input_to_messages(items, prior=spec.messages, lowering=lowering)
        tools = list(spec.tools)
        names = {t.name for t in tools}
        found = [t for item in items if item["type"] == "tool_search_output" for t in item["tools"]]
        loaded = responses_tools(undeferred(found), self.engine.check_schema)
        for tool in loaded.tools:
            if tool.name not in names:
                tools.append(tool)
                names.add(tool.name)
                routes[tool.name] = loaded.routes[tool.name]
        if searched >= self.max_searches:
            tools = [t for t in tools if t.name != SEARCH_NAME]
        # a forced choice was the first pass's: from here the model may answer
        policy = spec.policy
        allowed = policy.allowed
        if allowed is not None:
            allowed = (*allowed, *(t.name for t in loaded.tools if t.name not in allowed))
        policy = replace(policy, mode="auto" if policy.mode == "required" else policy.mode)
        policy = replace(policy, allowed=allowed)
        return replace(spec, messages=[*spec.messages, *added], tools=tools, policy=policy)

    async def start(self, spec: GenerationSpec) -> core.Run:
        return core.run(await core.prepare(self.engine, spec), self.runs)


async def searching_events(
    machine: ResponseEventMachine,
    first: core.Run,
    lead: list[JSON],
    loop: SearchLoop,
    *,
    started: bool = False,
) -> AsyncGenerator[ResponseStreamEvent, None]:
    """The events of a response run in passes; `first` is the admitted first pass
    (`started`: the machine has already sent its start)."""
    for event in [] if started else machine.start():
        yield event
    for made in lead:
        for event in machine.whole_item(made):
            yield event
    run, spec, total, searched = first, loop.spec, Usage(), 0
    while True:
        mark = len(machine.output)
        finished: Finished | None = None
        async with aclosing(run):
            async for item in run:
                machine.generated_tokens = total.output_tokens + run.produced
                if isinstance(item, Finished):
                    finished = item
                elif isinstance(item, Started):
                    for event in machine.begin():
                        yield event
                else:
                    for event in machine.apply(item):
                        yield event
        assert finished is not None  # a run always ends with its Finished
        total = _add(total, finished.usage)
        calls = loop.searches(machine.output[mark:]) if finished.reason == "stop" else []
        if not calls:
            for event in machine.end(replace(finished, usage=total)):
                yield event
            return
        for call in calls:
            for event in machine.whole_item(loop.output_item(call)):
                yield event
        searched += len(calls)
        spec = loop.next_spec(spec, machine.output[mark:], searched, machine.routes)
        budget = loop.spec.sampling.max_tokens  # the whole response's, every pass included
        if budget is not None:
            if total.output_tokens >= budget:
                for event in machine.finish(usage=total, incomplete_reason="max_output_tokens"):
                    yield event
                return
            left = budget - total.output_tokens
            spec = replace(spec, sampling=replace(spec.sampling, max_tokens=left))
        try:
            run = await loop.start(spec)
        except APIError as exc:
            machine.usage = total
            for event in machine.fail(exc.message, code=exc.code or "server_error"):
                yield event
            return
