"""A response whose model calls tools this server runs: several passes of the model in one
response.

A pass that ends having called server-run tools (an MCP server's tool, a file or web
search, a hosted tool search) gets each call run, its item finished with the result, and
the model goes on in a new pass whose prompt holds the calls and what they gave (a tool
search's found tools join its tools). Every pass writes into the same event machine, so the
client sees one response: its items in order, its usage the sum of the passes'. The
response ends when a pass answers, calls a tool the client runs (the server-run calls of
that pass still run), or when the server-run calls reach the response's cap (the model is
then no longer offered them). A pass that cannot start (the prompt grew past the context,
the engine is full) fails the response, with the items so far kept. Cancelling (a client
that hangs up, a cancel, shutdown) stops a running call as it stops generation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field, replace
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
from respd.service.tools.hosted.base import Outcome
from respd.service.tools.hosted.plan import HostedTools
from respd.service.tools.tool_search import (
    MAX_SEARCHES,
    SEARCH_NAME,
    SearchPlan,
    search,
    undeferred,
)

log = logging.getLogger(__name__)
JSON = dict[str, Any]
# The client-run calls (and approvals asked) that end a response whatever else the pass did.
_CLIENT_ITEMS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "mcp_approval_request",
    }
)
# Server-run calls one response may make when the request sets no `max_tool_calls`.
MAX_SERVER_CALLS = 8


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.input_tokens + b.input_tokens,
        a.output_tokens + b.output_tokens,
        a.cached_tokens + b.cached_tokens,
        a.reasoning_tokens + b.reasoning_tokens,
    )


@dataclass
class ToolLoop:
    """What a new pass needs: the engine, the first pass's spec, the runs in flight, the
    deferred tools (hosted tool search) and the server-run tools, and how many server-run
    calls the response may make (`max_searches` bounds tool searches among them)."""

    engine: Engine
    spec: GenerationSpec
    runs: ActiveRuns | None
    plan: SearchPlan | None = None
    hosted: HostedTools | None = None
    max_calls: int = MAX_SERVER_CALLS
    max_searches: int = MAX_SEARCHES
    # the full result text of each server-run call, by item id, for the next pass
    results: dict[str, str] = field(default_factory=dict)

    def searches(self, items: list[JSON]) -> list[JSON]:
        """The hosted searches a pass made."""
        if self.plan is None:
            return []
        return [
            item
            for item in items
            if item["type"] == "tool_search_call"
            and item.get("execution") == "server"
            and item.get("status") == "completed"
        ]

    def output_item(self, call: JSON) -> JSON:
        assert self.plan is not None
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
        self,
        spec: GenerationSpec,
        items: list[JSON],
        made: int,
        searched: int,
        routes: dict[str, ToolRoute],
    ) -> GenerationSpec:
        """The next pass: the conversation with this pass's items, the tools found added
        (their calls mapping back through `routes`); the server-run tools left out once the
        response has called enough of them."""
        lowering = Lowering(self.engine.model_id, self.engine.vision)
        added = input_to_messages(
            items, prior=spec.messages, lowering=lowering, results=self.results
        )
        tools = list(spec.tools)
        names = {t.name for t in tools}
        found = [t for item in items if item["type"] == "tool_search_output" for t in item["tools"]]
        loaded = responses_tools(undeferred(found), self.engine.check_schema)
        for tool in loaded.tools:
            if tool.name not in names:
                tools.append(tool)
                names.add(tool.name)
                routes[tool.name] = loaded.routes[tool.name]
        if searched >= self.max_searches or made >= self.max_calls:
            tools = [t for t in tools if t.name != SEARCH_NAME]
        if made >= self.max_calls and self.hosted is not None:
            tools = [t for t in tools if t.name not in self.hosted.routes]
        # a forced choice was the first pass's: from here the model may answer
        policy = spec.policy
        allowed = policy.allowed
        if allowed is not None:
            allowed = (*allowed, *(t.name for t in loaded.tools if t.name not in allowed))
            allowed = tuple(name for name in allowed if name in {t.name for t in tools})
        policy = replace(policy, mode="auto" if policy.mode == "required" else policy.mode)
        policy = replace(policy, allowed=allowed or None)
        if not tools:
            policy = replace(policy, mode="none", allowed=None)
        return replace(spec, messages=[*spec.messages, *added], tools=tools, policy=policy)

    async def start(self, spec: GenerationSpec) -> core.Run:
        return core.run(await core.prepare(self.engine, spec), self.runs)


class _Interrupted(Exception):
    """A shutdown stopped a running tool call (not this response's own cancellation)."""


async def _tracked(runs: ActiveRuns | None, work: Coroutine[Any, Any, Outcome]) -> Outcome:
    """`work` as a task a shutdown waits for, then cancels, as it does generation."""
    task = asyncio.ensure_future(work)
    if runs is None:
        return await task
    runs.track(task)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if task.cancelled() and current is not None and not current.cancelling():
            raise _Interrupted from None
        raise


async def _run_calls(
    machine: ResponseEventMachine, loop: ToolLoop, made: int
) -> AsyncGenerator[ResponseStreamEvent, None]:
    """Run the server-run calls the pass wrote, in order; those past the cap are closed
    unrun."""
    hosted = loop.hosted
    for call in list(machine.pending):
        if hosted is None or made >= loop.max_calls:
            continue
        made += 1
        for event in machine.run_started(call.output_index):
            yield event
        # still pending while it runs: a cancel or failure meanwhile closes it incomplete
        outcome = await _tracked(loop.runs, hosted.run(call.route, call.arguments))
        machine.pending.remove(call)
        loop.results[call.id] = outcome.text
        for event in machine.run_finished(call.output_index, outcome):
            yield event
    for event in machine.close_pending():
        yield event


async def tool_loop_events(
    machine: ResponseEventMachine,
    first: core.Run,
    lead: list[JSON],
    loop: ToolLoop,
    *,
    started: bool = False,
) -> AsyncGenerator[ResponseStreamEvent, None]:
    """The events of a response run in passes; `first` is the admitted first pass
    (`started`: the machine has already sent its start)."""
    for event in [] if started else machine.start():
        yield event
    for made_item in lead:
        ran = made_item["type"] in ("mcp_list_tools", "mcp_call")
        for event in machine.ran_item(made_item) if ran else machine.whole_item(made_item):
            yield event
    run, spec, total, searched, made = first, loop.spec, Usage(), 0, 0
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
        if finished.reason != "stop":
            for event in machine.close_pending():
                yield event
            for event in machine.end(replace(finished, usage=total)):
                yield event
            return
        calls = len(machine.pending)
        try:
            async with aclosing(_run_calls(machine, loop, made)) as running:
                async for event in running:
                    yield event
        except _Interrupted:  # the server is shutting down: as an interrupted generation
            for event in machine.finish(usage=total, incomplete=True):
                yield event
            return
        made += calls
        searches = loop.searches(machine.output[mark:])
        for call in searches:
            for event in machine.whole_item(loop.output_item(call)):
                yield event
        searched += len(searches)
        made += len(searches)
        client = any(item["type"] in _CLIENT_ITEMS for item in machine.output[mark:])
        if client or not (calls or searches):
            for event in machine.end(replace(finished, usage=total)):
                yield event
            return
        spec = loop.next_spec(spec, machine.output[mark:], made, searched, machine.routes)
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
