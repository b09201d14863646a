"""Real logprobs: Responses (`include: ["message.output_text.logprobs"]` + `top_logprobs`) and
Chat Completions (`logprobs` + `top_logprobs`) through the real SDK against a real server,
checked against an independent in-process evaluation of the same GGUF."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import llama_cpp
import numpy as np
import openai
import pytest
from llama_cpp import _internals as internals
from openai.types.chat import ChatCompletionTokenLogprob
from openai.types.responses import ResponseTextDeltaEvent
from openai.types.responses.response_output_text import Logprob as OutputTextLogprob
from openai.types.responses.response_text_delta_event import Logprob as DeltaLogprob

from respd.config import embedded_model_path
from respd.engines.base import ChatMessage
from respd.engines.llamacpp import LlamaCppEngine, cpu_advertises_amx
from tests.support.logprobs import message_logprobs, part_logprobs
from tests.support.servers import MODEL_ID, RespdServer, start_server

PROMPT = "What is the capital of France?"
INCLUDE: list[Any] = ["message.output_text.logprobs"]
# Greedy with no penalty (DRY is on by default for the embedded model): the sampled token is
# then the most likely one, which the checks below rely on.
GREEDY: dict[str, Any] = {"dry_multiplier": 0}
TOL = 1e-3  # server vs in-process float paths (batched prefill, other matmul shapes)


def check_logprobs(lps: Sequence[Any], text: str, top: int) -> None:
    """The invariants of every token list, SDK-typed items with token/bytes/logprob/top."""
    assert lps, "no logprobs"
    for lp in lps:
        assert lp.logprob <= 0
        alts = lp.top_logprobs or []
        assert len(alts) == top
        values = [a.logprob for a in alts]
        assert values == sorted(values, reverse=True)
        assert all(v <= 0 for v in values)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-6
        if top:  # greedy, no penalties: the sampled token is the most likely one
            assert alts[0].token == lp.token and alts[0].logprob == lp.logprob
            assert alts[0].bytes == lp.bytes
    joined = b"".join(bytes(lp.bytes) for lp in lps)
    assert joined.decode("utf-8", errors="replace") == text


# -- Responses ---------------------------------------------------------------------------------


def test_responses_logprobs_non_stream_and_stored(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL_ID,
        input=PROMPT,
        include=INCLUDE,
        top_logprobs=5,
        temperature=0,
        extra_body=GREEDY,
        max_output_tokens=24,
    )
    assert resp.top_logprobs == 5
    lps = part_logprobs(resp)
    assert all(isinstance(lp, OutputTextLogprob) for lp in lps)
    check_logprobs(lps, resp.output_text, 5)
    # one entry per generated token; the token that ended the turn has none
    assert resp.usage is not None and len(lps) == resp.usage.output_tokens
    stored = client.responses.retrieve(resp.id)
    assert [lp.model_dump() for lp in part_logprobs(stored)] == [lp.model_dump() for lp in lps]


def test_responses_logprobs_stream(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL_ID,
        input="Name three colours.",
        include=INCLUDE,
        top_logprobs=3,
        temperature=0,
        extra_body=GREEDY,
        max_output_tokens=24,
    ) as stream:
        events = list(stream)
    # cut at max_output_tokens: the terminal event is response.incomplete
    (final,) = [
        e.response for e in events if e.type in ("response.completed", "response.incomplete")
    ]
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert deltas
    streamed: list[dict[str, Any]] = []
    for d in deltas:
        assert all(isinstance(lp, DeltaLogprob) for lp in d.logprobs)
        # each delta carries exactly its own tokens (real OpenAI sends `bytes` too)
        got = b"".join(bytes(lp.model_dump()["bytes"]) for lp in d.logprobs)
        assert got.decode("utf-8", errors="replace") == d.delta
        streamed += [lp.model_dump() for lp in d.logprobs]
    lps = part_logprobs(final)
    check_logprobs(lps, final.output_text, 3)
    assert streamed == [lp.model_dump() for lp in lps]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [lp.model_dump() for lp in done.logprobs] == streamed


def test_responses_without_include_have_no_logprobs(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL_ID,
        input=PROMPT,
        top_logprobs=4,
        temperature=0,
        extra_body=GREEDY,
        max_output_tokens=8,
    )
    assert resp.top_logprobs == 4  # echoed, but logprobs need the include
    assert resp.output_text and part_logprobs(resp) == []
    with client.responses.stream(
        model=MODEL_ID, input=PROMPT, temperature=0, extra_body=GREEDY, max_output_tokens=8
    ) as stream:
        deltas = [e for e in stream if isinstance(e, ResponseTextDeltaEvent)]
    assert deltas and all(d.logprobs == [] for d in deltas)


@pytest.mark.parametrize("value", [21, -1])
def test_responses_top_logprobs_out_of_range_is_400(client: openai.OpenAI, value: int) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model=MODEL_ID, input=PROMPT, include=INCLUDE, top_logprobs=value, max_output_tokens=2
        )
    assert err.value.param == "top_logprobs"


def test_responses_top_logprobs_zero_gives_sampled_token_only(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL_ID,
        input=PROMPT,
        include=INCLUDE,
        temperature=0,
        extra_body=GREEDY,
        max_output_tokens=6,
    )
    assert resp.top_logprobs == 0
    check_logprobs(part_logprobs(resp), resp.output_text, 0)


# -- against an independent evaluation of the model -----------------------------------------


@pytest.fixture(scope="module")
def prompt_tokens() -> Iterator[list[int]]:
    """The exact prompt respd sends for `input=PROMPT`: its own template and tokenizer."""
    engine = LlamaCppEngine(
        embedded_model_path(), model_id=MODEL_ID, n_ctx=256, parallel=1, n_threads=1
    )
    try:
        yield engine.tokenize(engine.render_prompt([ChatMessage("user", PROMPT)]))
    finally:
        engine.close()


def reference_logprobs(tokens: list[int]) -> tuple[np.ndarray, list[bytes]]:
    """Log-softmax of the model's next-token logits after `tokens`, computed here with
    llama.cpp directly: a model and context of this test's own, one plain decode, with
    llama.cpp's default context settings as respd uses them (flash attention on `auto`,
    which changes CPU logprobs by up to ~0.1 nats against the non-flash kernels). The low
    level API, because `llama_cpp.Llama` cannot turn off weight repacking, which segfaults
    on the AMX CPUs `cpu_advertises_amx` detects."""
    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = not cpu_advertises_amx()
    model = internals.LlamaModel(
        path_model=str(embedded_model_path()), params=mparams, verbose=False
    )
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = 512
    cparams.n_threads = cparams.n_threads_batch = 2
    ctx = internals.LlamaContext(model=model, params=cparams, verbose=False)
    try:
        batch = (llama_cpp.llama_token * len(tokens))(*tokens)
        rc = llama_cpp.llama_decode(ctx.ctx, llama_cpp.llama_batch_get_one(batch, len(tokens)))
        assert rc == 0
        n_vocab = model.n_vocab()
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx.ctx, -1), shape=(n_vocab,))
        x = row.astype(np.float64)
        logp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
        pieces = [model.detokenize([t], special=False) for t in range(n_vocab)]
    finally:
        ctx.close()
        model.close()
    return logp, pieces


@pytest.fixture(scope="module")
def solo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    """A server of its own, one slot, that has served nothing: its prompt is decoded as a
    single sequence from an empty cache, exactly as the reference is. (A slot whose cached
    prefix was computed inside mixed batches gives logits that differ by up to ~0.2 nats:
    batch shape changes the floating-point path; see docs/operating/performance.md.)"""
    srv = start_server(tmp_path_factory.mktemp("respd-solo"), "--parallel", "1", "--threads", "2")
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def test_first_token_logprob_matches_the_engine(
    solo_server: RespdServer, prompt_tokens: list[int]
) -> None:
    resp = solo_server.client().responses.create(
        model=MODEL_ID,
        input=PROMPT,
        include=INCLUDE,
        top_logprobs=5,
        temperature=0,
        extra_body=GREEDY,
        max_output_tokens=1,
    )
    assert resp.usage is not None and resp.usage.input_tokens == len(prompt_tokens)
    first = part_logprobs(resp)[0]
    logp, pieces = reference_logprobs(prompt_tokens)
    order = np.argsort(-logp, kind="stable")
    best = int(order[0])
    assert logp[best] < -0.01, "pick a prompt whose first token is not a certainty"
    assert bytes(first.bytes) == pieces[best]
    diffs = [abs(first.logprob - float(logp[best]))]
    ref_top = [int(t) for t in order[:5]]
    assert [bytes(a.bytes) for a in first.top_logprobs] == [pieces[t] for t in ref_top]
    assert [a.token for a in first.top_logprobs] == [
        pieces[t].decode("utf-8", errors="replace") for t in ref_top
    ]
    diffs += [
        abs(a.logprob - float(logp[t])) for a, t in zip(first.top_logprobs, ref_top, strict=True)
    ]
    print(f"max |server - reference| logprob over top-5: {max(diffs):.2e}")
    assert max(diffs) < TOL


# -- Chat Completions ---------------------------------------------------------------------------


def test_chat_logprobs_non_stream(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": PROMPT}],
        logprobs=True,
        top_logprobs=4,
        temperature=0,
        extra_body=GREEDY,
        max_tokens=24,
    )
    choice = out.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    lps = choice.logprobs.content
    assert all(isinstance(lp, ChatCompletionTokenLogprob) for lp in lps)
    check_logprobs(lps, choice.message.content or "", 4)
    assert out.usage is not None and len(lps) == out.usage.completion_tokens
    plain = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": PROMPT}], max_tokens=4
    )
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "Name three colours."}],
            logprobs=True,
            top_logprobs=2,
            temperature=0,
            extra_body=GREEDY,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    lps: list[ChatCompletionTokenLogprob] = []
    text = ""
    for c in chunks:
        if not c.choices or not c.choices[0].delta.content:
            continue
        lp = c.choices[0].logprobs
        assert lp is not None and lp.content is not None
        got = b"".join(bytes(t.bytes or []) for t in lp.content)
        assert got.decode("utf-8", errors="replace") == c.choices[0].delta.content
        lps += lp.content
        text += c.choices[0].delta.content
    check_logprobs(lps, text, 2)
    usage = chunks[-1].usage
    assert usage is not None and len(lps) == usage.completion_tokens


def test_chat_logprobs_with_stop_cover_the_text_before_it(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "List the days of the week."}]
    base = client.chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=40, temperature=0
    )
    full = base.choices[0].message.content or ""
    assert len(full) > 12
    stop = full[8:11]
    cut = client.chat.completions.create(
        model=MODEL_ID,
        messages=messages,
        max_tokens=40,
        temperature=0,
        extra_body=GREEDY,
        stop=[stop],
        logprobs=True,
    )
    content = cut.choices[0].message.content or ""
    assert content == full[: full.index(stop)]
    assert cut.choices[0].logprobs is not None and cut.choices[0].logprobs.content is not None
    lps = cut.choices[0].logprobs.content
    joined = b"".join(bytes(t.bytes or []) for t in lps).decode("utf-8", errors="replace")
    # tokens wholly before the stop string; at most the one it starts in is left out
    assert content.startswith(joined)
    assert len(lps) >= 1 and len(content) - len(joined) < 8


@pytest.mark.parametrize(
    "extra",
    [
        {"top_logprobs": 2},
        {"logprobs": False, "top_logprobs": 2},
        {"logprobs": True, "top_logprobs": 21},
    ],
)
def test_chat_top_logprobs_needs_logprobs_and_range(
    client: openai.OpenAI, extra: dict[str, Any]
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **extra
        )
    assert err.value.param == "top_logprobs"


# -- grammar and parser paths on a real server ----------------------------------------------

WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def test_grammar_constrained_text_has_raw_logprobs(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string"}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    resp = client.responses.create(
        model=MODEL_ID,
        input=PROMPT + " Answer in JSON.",
        include=INCLUDE,
        top_logprobs=3,
        temperature=0,
        extra_body=GREEDY,
        max_output_tokens=32,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
    )
    lps = part_logprobs(resp)
    assert resp.usage is not None and len(lps) == resp.usage.output_tokens
    joined = b"".join(bytes(lp.bytes) for lp in lps).decode("utf-8", errors="replace")
    assert joined == resp.output_text
    for lp in lps:  # the grammar may pick a token the raw distribution ranks lower
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 3
        assert lp.logprob <= lp.top_logprobs[0].logprob


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_tool_paths_give_logprobs_only_to_message_text(
    client: openai.OpenAI, tool_choice: Any
) -> None:
    resp = client.responses.create(
        model=MODEL_ID,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice=tool_choice,
        include=INCLUDE,
        top_logprobs=2,
        temperature=0,
        extra_body=GREEDY,
        max_output_tokens=48,
    )
    assert resp.usage is not None
    total = 0
    for item in resp.output:
        if item.type == "message":
            text = item.content[0].text if item.content[0].type == "output_text" else ""
            lps = message_logprobs(item)
            total += len(lps)
            joined = b"".join(bytes(lp.bytes) for lp in lps).decode("utf-8", errors="replace")
            assert joined in text  # message tokens only, in order
        else:
            assert item.type == "function_call"
    if all(i.type == "message" for i in resp.output):  # no call: all text passed through
        assert total == resp.usage.output_tokens
    if tool_choice == "required":
        assert [i.type for i in resp.output] == ["function_call"] and total == 0
    assert total <= resp.usage.output_tokens
