"""A model served by several providers, through the app: the request's `provider` object
picks and orders them, a failure before the first output falls back to the next provider
without duplicating text, a failure after it ends the response failed, circuits open and
close, and the answer names its provider (field, header, metrics, routing table). The
providers are fake engines scripted to fail; every response is checked with the SDK's
types."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from respd.api.app import create_app
from respd.api.identity import KeyRing
from respd.engines.base import Prompt, SamplingParams
from respd.engines.constraints import Constraint
from respd.engines.fake import FakeEngine, Reply
from respd.engines.routing import Breaker, Provider, RoutedEngine
from respd.engines.upstream import UpstreamSpec
from respd.service.models import ModelRegistry
from respd.store import MemoryStore
from respd.upstreams import UpstreamsError, read_upstreams_file
from tests.support.fake import streamed
from tests.support.sdk_types import strict_response

PUBLIC = "meta/llama-test"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _provider(name: str, engine: FakeEngine, **more: Any) -> Provider:
    return Provider(name, name, engine, **more)


def _fake(*replies: Reply | str, **more: Any) -> FakeEngine:
    return FakeEngine(replies, **more)


def _down(status: int = 503) -> Reply:
    return Reply([], finish="error", error=f"upstream said {status}", status=status)


def _app(*providers: Provider, **settings: Any) -> httpx.AsyncClient:
    routed = RoutedEngine(PUBLIC, providers)
    app = create_app(ModelRegistry([routed]), MemoryStore(), **settings)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def _create(http: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await http.post("/v1/responses", json={"model": PUBLIC, "input": "hi", **body})


async def test_order_is_honoured_and_the_answer_names_its_provider() -> None:
    a, b = _fake("from a"), _fake("from b")
    async with _app(_provider("a", a), _provider("b", b)) as http:
        r = await _create(http, provider={"order": ["b", "a"]})
        assert r.status_code == 200, r.text
        body = r.json()
        strict_response(body)
        assert body["output"][0]["content"][0]["text"] == "from b"
        assert body["model"] == PUBLIC
        assert body["provider"] == {"name": "b", "failed": [], "cost": None}
        assert r.headers["x-respd-provider"] == "b"
        assert not a.calls
        stored = (await http.get(f"/v1/responses/{body['id']}")).json()
        assert stored["provider"]["name"] == "b"
        # No preferences: the configured order.
        r = await _create(http)
        assert r.json()["output"][0]["content"][0]["text"] == "from a"


async def test_a_failure_before_the_first_output_falls_back_without_duplicating() -> None:
    a, b = _fake(_down(503)), _fake(Reply(["Hel", "lo"]))
    pa, pb = _provider("a", a), _provider("b", b)
    async with _app(pa, pb) as http:
        events = await streamed(http, {"model": PUBLIC, "input": "hi"})
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Hello"
    done = events[-1]
    assert done["type"] == "response.completed"
    assert done["response"]["provider"]["name"] == "b"
    assert done["response"]["provider"]["failed"] == [
        {"name": "a", "status": 503, "message": "upstream said 503"}
    ]
    assert pa.stats.failed == 1 and pa.stats.fallbacks == 1 and pb.stats.succeeded == 1
    assert pb.stats.latency is not None


@pytest.mark.parametrize("status", [429, 502, 504])
async def test_overload_and_server_errors_fall_back(status: int) -> None:
    b = _fake("saved")
    async with _app(_provider("a", _fake(_down(status))), _provider("b", b)) as http:
        r = await _create(http)
    assert r.status_code == 200
    assert r.headers["x-respd-provider"] == "b; failed=a"


async def test_a_failure_after_the_first_output_ends_the_response_failed() -> None:
    broken = Reply(["Hel"], finish="error", error="connection reset", status=502)
    b = _fake("never")
    async with _app(_provider("a", _fake(broken)), _provider("b", b)) as http:
        events = await streamed(http, {"model": PUBLIC, "input": "hi"})
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["Hel"]
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["provider"]["name"] == "a"
    assert not b.calls


async def test_without_fallbacks_the_first_provider_s_error_is_the_answer() -> None:
    b = _fake("never")
    async with _app(_provider("a", _fake(_down(503))), _provider("b", b)) as http:
        r = await _create(http, provider={"allow_fallbacks": False})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "server_error"
    assert not b.calls


async def test_the_request_s_own_fault_is_not_retried_elsewhere() -> None:
    b = _fake("never")
    refused = Reply([], finish="error", error="bad temperature", status=400)
    pa = _provider("a", _fake(refused))
    async with _app(pa, _provider("b", b)) as http:
        r = await _create(http)
    assert r.status_code == 400 and "bad temperature" in r.text
    assert not b.calls
    assert pa.breaker.consecutive == 0


async def test_only_ignore_and_sort_select_providers() -> None:
    def fresh() -> list[Provider]:
        return [
            _provider("a", _fake(*["from a"] * 4), price_prompt=5.0, price_completion=5.0),
            _provider("b", _fake(*["from b"] * 4), price_prompt=1.0, price_completion=2.0),
            _provider("c", _fake(*["from c"] * 4)),
        ]

    async def answer(providers: list[Provider], prefs: dict[str, Any]) -> str:
        async with _app(*providers) as http:
            r = await _create(http, provider=prefs)
            assert r.status_code == 200, r.text
            return str(r.json()["provider"]["name"])

    assert await answer(fresh(), {"only": ["c"]}) == "c"
    assert await answer(fresh(), {"ignore": ["a"]}) == "b"
    assert await answer(fresh(), {"sort": "price"}) == "b"
    assert await answer(fresh(), {"max_price": {"prompt": 2}}) == "b"
    measured = fresh()
    measured[0].stats.latency, measured[1].stats.latency = 0.5, 0.1
    measured[0].stats.throughput, measured[1].stats.throughput = 90.0, 30.0
    assert await answer(measured, {"sort": "latency"}) == "b"
    assert await answer(measured, {"sort": "throughput"}) == "a"
    # `order` goes before `sort`; the rest follow sorted.
    assert await answer(fresh(), {"order": ["c"], "sort": "price"}) == "c"


async def test_the_cost_is_reported_from_the_provider_s_prices() -> None:
    priced = _provider("a", _fake("priced"), price_prompt=2.0, price_completion=10.0)
    async with _app(priced) as http:
        body = (await _create(http)).json()
    usage = body["usage"]
    expected = (usage["input_tokens"] * 2.0 + usage["output_tokens"] * 10.0) / 1e6
    assert body["provider"]["cost"] == pytest.approx(expected)


async def test_preferences_that_rule_out_every_provider_are_a_400() -> None:
    async with _app(_provider("a", _fake("x"))) as http:
        r = await _create(http, provider={"only": ["nobody"]})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "provider"
        assert r.json()["error"]["code"] == "no_provider_available"
        r = await _create(http, provider={"order": ["a"], "colour": "red"})
        assert r.status_code == 400
        assert "colour" in r.json()["error"]["message"] + str(r.json()["error"]["param"])
        r = await _create(http, provider={"sort": "cheapest"})
        assert r.status_code == 400


async def test_the_breaker_opens_after_failures_and_closes_after_the_cooldown() -> None:
    clock = Clock()
    a = _fake(_down(), _down(), "a is back")
    pa = _provider("a", a, breaker=Breaker(failures=2, cooldown=30.0, clock=clock))
    pb = _provider("b", _fake(*["from b"] * 5))
    async with _app(pa, pb) as http:
        for _ in range(2):
            r = await _create(http)
            assert r.headers["x-respd-provider"] == "b; failed=a"
        assert pa.breaker.state == "open"
        r = await _create(http)  # skipped: a is not even asked
        assert r.headers["x-respd-provider"] == "b" and len(a.calls) == 2
        providers = (await http.get("/v1/providers")).json()["data"]
        assert [(p["provider"], p["circuit"]) for p in providers] == [
            ("a", "open"),
            ("b", "closed"),
        ]
        clock.now += 31  # half open: one request probes a, and its success closes it
        r = await _create(http)
        assert r.headers["x-respd-provider"] == "a" and pa.breaker.state == "closed"


async def test_every_allowed_provider_open_is_a_503() -> None:
    clock = Clock()
    pa = _provider("a", _fake(_down()), breaker=Breaker(failures=1, cooldown=30.0, clock=clock))
    async with _app(pa, _provider("b", _fake("b"))) as http:
        r = await _create(http, provider={"only": ["a"]})
        assert r.status_code == 503
        r = await _create(http, provider={"only": ["a"]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "provider_unavailable"
        assert r.headers["retry-after"]


async def test_a_slow_first_output_times_out_to_the_next_provider() -> None:
    slow = _provider("a", _fake(Reply(["late"], delay=2.0)), first_byte_timeout=0.2)
    async with _app(slow, _provider("b", _fake("quick"))) as http:
        r = await _create(http)
    assert r.json()["provider"]["failed"][0]["status"] == 504
    assert r.json()["output"][0]["content"][0]["text"] == "quick"


async def test_a_busy_provider_is_passed_over() -> None:
    busy = _provider("a", _fake("x", capacity=0))
    async with _app(busy, _provider("b", _fake("b"))) as http:
        r = await _create(http)
    assert r.json()["provider"]["name"] == "b"


class _Emulating(FakeEngine):
    """An upstream that forces calls only by asking for a schema answer."""

    def emulates_calls(self, constraint: Constraint | None) -> bool:
        return constraint is not None and bool(constraint.forced_calls)


async def test_require_parameters_skips_providers_that_would_emulate() -> None:
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    emulating = _provider("a", _Emulating([call]))
    native = _provider("b", _fake(call))
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    async with _app(emulating, native) as http:
        r = await _create(
            http, tools=[tool], tool_choice="required", provider={"require_parameters": True}
        )
    assert r.status_code == 200, r.text
    assert r.json()["provider"]["name"] == "b"
    assert r.json()["output"][0]["type"] == "function_call"


async def test_chat_completions_route_and_name_their_provider() -> None:
    a, b = _fake(_down(), _down()), _fake("chat b", "chat b")
    async with _app(_provider("a", a), _provider("b", b)) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": PUBLIC, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200, r.text
        completion = ChatCompletion.model_validate(r.json())
        assert completion.choices[0].message.content == "chat b"
        assert r.headers["x-respd-provider"] == "b; failed=a"
        assert r.json()["provider"]["name"] == "b"
        chunks = []
        body = {
            "model": PUBLIC,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "provider": {"order": ["a", "b"]},
        }
        async with http.stream("POST", "/v1/chat/completions", json=body) as s:
            async for line in s.aiter_lines():
                if line.startswith("data: {"):
                    chunks.append(ChatCompletionChunk.model_validate_json(line[6:]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "chat b"
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert final[0].model_extra and final[0].model_extra["provider"]["name"] == "b"


async def test_background_responses_fall_back_too() -> None:
    async with _app(_provider("a", _fake(_down())), _provider("b", _fake("bg"))) as http:
        r = await _create(http, background=True, store=True)
        rid = r.json()["id"]
        for _ in range(200):
            body = (await http.get(f"/v1/responses/{rid}")).json()
            if body["status"] not in ("queued", "in_progress"):
                break
            await asyncio.sleep(0.02)
    assert body["status"] == "completed"
    assert body["provider"]["name"] == "b" and body["provider"]["failed"][0]["name"] == "a"


async def test_bare_names_resolve_to_their_vendor_id() -> None:
    async with _app(_provider("a", _fake("x"))) as http:
        r = await http.post("/v1/responses", json={"model": "llama-test", "input": "hi"})
        assert r.status_code == 200 and r.json()["model"] == PUBLIC
        models = (await http.get("/v1/models")).json()["data"]
        assert models[0]["id"] == PUBLIC and models[0]["providers"] == ["a"]


async def test_the_routing_table_and_metrics_are_behind_the_operator_key() -> None:
    pa = _provider("a", _fake("x"))
    async with _app(pa, metrics_api_key="ops", keys=KeyRing(["user-key"])) as http:
        assert (await http.get("/v1/providers")).status_code == 401
        user = {"authorization": "Bearer user-key"}
        assert (await http.get("/v1/providers", headers=user)).status_code == 401
        ops = {"authorization": "Bearer ops"}
        r = await http.post("/v1/responses", json={"model": PUBLIC, "input": "hi"}, headers=user)
        assert r.status_code == 200
        table = (await http.get("/v1/providers", headers=ops)).json()["data"]
        assert table[0]["provider"] == "a" and table[0]["succeeded"] == 1
        metrics = (await http.get("/metrics", headers=ops)).text
    sample = 'respd_provider_requests_total{model="%s",outcome="succeeded",provider="a"} 1.0'
    assert sample % PUBLIC in metrics
    assert "respd_provider_first_output_seconds_count" in metrics


async def test_cancelling_a_stream_stops_the_provider() -> None:
    slow = _fake(Reply(["a"] * 200, delay=0.01))
    async with _app(_provider("a", slow)) as http:
        body = {"model": PUBLIC, "input": "hi", "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as r:
            async for line in r.aiter_lines():
                if "output_text.delta" in line:
                    break
    for _ in range(100):
        if slow.calls[0].cancelled:
            break
        await asyncio.sleep(0.01)
    assert slow.calls[0].cancelled


def test_entries_join_a_public_id_with_prices_and_limits() -> None:
    spec = UpstreamSpec.parse(
        "v1=http://gpu1:8000/v1,model=llama,provider=gpu1,model_id=meta/llama,"
        "price_prompt=0.5,price_completion=1.5,concurrency=4,timeout=20"
    )
    assert spec.routed and spec.public_id == "meta/llama" and spec.provider_name == "gpu1"
    assert (spec.price_prompt, spec.price_completion, spec.concurrency, spec.timeout) == (
        0.5,
        1.5,
        4,
        20.0,
    )
    plain = UpstreamSpec.parse("big=http://h/v1")
    assert not plain.routed and plain.public_id == "big" and plain.provider_name == "big"
    for bad in (
        "a=http://h/v1,price_prompt=-1",
        "a=http://h/v1,concurrency=0",
        "a=http://h/v1,timeout=0",
    ):
        with pytest.raises(ValueError):
            UpstreamSpec.parse(bad)


def test_the_upstreams_file(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(
        '[[upstream]]\nalias = "one"\nurl = "http://127.0.0.1:1/v1"\nmodel = "m"\n'
        'model_id = "meta/m"\nprice_prompt = 1\n\n'
        '[[upstream]]\nalias = "two"\nurl = "http://127.0.0.1:2/v1"\nmodel = "m"\n'
        'model_id = "meta/m"\nprovider = "backup"\n'
    )
    one, two = read_upstreams_file(path)
    assert one.public_id == two.public_id == "meta/m" and two.provider_name == "backup"
    path.write_text('[[upstream]]\nalias = "x"\nurl = "http://h/v1"\ncolour = "red"\n')
    with pytest.raises(UpstreamsError, match="colour"):
        read_upstreams_file(path)
    path.write_text("[[upstream]\n")
    with pytest.raises(UpstreamsError):
        read_upstreams_file(path)


async def test_a_prompt_too_long_for_one_provider_goes_to_another() -> None:
    small = _provider("small", _fake("never", context_window=8))
    large = _provider("large", _fake("fits"))
    engine = RoutedEngine(PUBLIC, [small, large])
    assert engine.context_window == 4096
    async with _app(small, large) as http:
        r = await _create(http, input="a long question " * 10)
    assert r.json()["provider"]["name"] == "large"


def test_sampling_reaches_the_provider_unchanged() -> None:
    params = SamplingParams(temperature=0.3)
    engine = _fake("x")
    routed = RoutedEngine(PUBLIC, [_provider("a", engine)])

    async def run() -> None:
        from respd.engines.base import PromptRequest
        from respd.engines.messages import ChatMessage

        prompt: Prompt = await routed.prepare(PromptRequest([ChatMessage("user", "hi")]))
        async for _ in routed.generate(prompt, params):
            pass

    asyncio.run(run())
    assert engine.calls[0].params.temperature == 0.3


async def test_an_answer_ended_early_still_names_its_provider() -> None:
    """A stop sequence ends the turn before the provider does: the generation is
    cancelled, and its end still says which provider answered."""
    long = Reply(["one ", "two ", "STOP", " three"] + ["x "] * 50)
    engine = _fake(long)
    async with _app(_provider("b", engine)) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": PUBLIC, "messages": [{"role": "user", "content": "hi"}], "stop": "STOP"},
        )
        body = r.json()
        assert r.status_code == 200, r.text
        assert ChatCompletion.model_validate(body).choices[0].message.content == "one two "
        assert body["choices"][0]["finish_reason"] == "stop"
        assert r.headers["x-respd-provider"] == "b"
        assert body["provider"]["name"] == "b"
    assert engine.calls[0].cancelled
