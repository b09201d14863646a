"""`/v1/embeddings` on a real server through the `openai` SDK: the local chat model embeds
(mean-pooled by llama.cpp), and a test-made embedding GGUF named by `--embedding-model`
(`tests/support/gguf/embedder.py`: it declares its pooling) answers under its own id."""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from respd.config.engine import embedded_model_path
from tests.support.gguf.embedder import write_embedding_model
from tests.support.servers import MODEL_ID, RespdServer, start_server


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_the_chat_model_embeds_texts_as_unit_vectors(client: openai.OpenAI) -> None:
    texts = [
        "The cat sat on the mat.",
        "A cat was sitting on the mat.",
        "Stock markets fell sharply today.",
        "The cat sat on the mat.",
    ]
    r = client.embeddings.create(model=MODEL_ID, input=texts)  # the SDK asks for base64
    assert r.model == MODEL_ID and [d.index for d in r.data] == [0, 1, 2, 3]
    v = [d.embedding for d in r.data]
    assert {len(x) for x in v} == {576}  # SmolLM2-135M's hidden size
    assert math.isclose(_dot(v[0], v[3]), 1.0, rel_tol=1e-5)  # a text with itself
    assert _dot(v[0], v[1]) > _dot(v[0], v[2])  # the paraphrase ranks above the unrelated
    assert r.usage.prompt_tokens == r.usage.total_tokens > 20
    floats = client.embeddings.create(model=MODEL_ID, input=texts[0], encoding_format="float")
    pairs = zip(floats.data[0].embedding, v[0], strict=True)
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in pairs)  # base64 = the floats


def test_token_inputs_and_limits(client: openai.OpenAI, http: httpx.Client) -> None:
    ids = [504, 2365, 3849, 335, 260, 5180, 30]  # any ids in the vocabulary
    r = client.embeddings.create(model=MODEL_ID, input=[ids, ids[:3]], dimensions=64)
    assert [len(d.embedding) for d in r.data] == [64, 64]
    assert r.usage.prompt_tokens == 10
    too_long = http.post("/v1/embeddings", json={"model": MODEL_ID, "input": "word " * 3000})
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    out_of_range = http.post("/v1/embeddings", json={"model": MODEL_ID, "input": [[49152]]})
    assert out_of_range.status_code == 400
    assert out_of_range.json()["error"]["param"] == "input[0]"


def test_a_client_that_hangs_up_stops_its_embeddings(server: RespdServer) -> None:
    """Forty long inputs (over a minute of work here), the client gone after a second: the
    server stops at the next input, and the next request is answered at once."""
    body = {"model": MODEL_ID, "input": [f"{i} " + "word " * 200 for i in range(40)]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/embeddings", json=body, timeout=1.0)
    started = time.monotonic()
    r = httpx.post(
        server.base_url + "/v1/embeddings", json={"model": MODEL_ID, "input": "hi"}, timeout=60
    )
    assert r.status_code == 200
    assert time.monotonic() - started < 20  # not the minute the forty inputs would take


def test_embeddings_waiting_their_turn_leave_the_rest_of_the_server_served(
    server: RespdServer,
) -> None:
    """Ten requests at once (more than the event loop's thread pool holds here: 6 threads
    on 2 cores) wait for the model one after another; meanwhile the store, whose calls run
    on that pool, answers a write at once — not after the requests queued ahead of it."""
    body = {"model": MODEL_ID, "input": [f"{i} " + "word " * 30 for i in range(3)]}

    def embed(_: int) -> int:
        return httpx.post(server.base_url + "/v1/embeddings", json=body, timeout=300).status_code

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        waiting = [pool.submit(embed, i) for i in range(10)]
        time.sleep(1.0)  # all ten sent, one running
        started = time.monotonic()
        made = httpx.post(server.base_url + "/v1/conversations", json={}, timeout=60)
        took = time.monotonic() - started
        assert made.status_code == 200 and not all(f.done() for f in waiting)
        assert took < 2.5, took
        assert [f.result() for f in waiting] == [200] * 10


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp("respd-embed")
    gguf = write_embedding_model(tmp / "bag-embed.gguf", embedded_model_path())
    srv = start_server(tmp, "--embedding-model", str(gguf), preset="compact")
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def test_an_embedding_model_answers_under_its_own_id(embedding_server: RespdServer) -> None:
    client = embedding_server.client()
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {MODEL_ID, "bag-embed"}  # its id: the file name
    assert (models["bag-embed"].model_extra or {}).get("endpoints") == ["/v1/embeddings"]
    texts = ["The cat sat on the mat.", "A cat was sitting on the mat.", "Markets fell today."]
    r = client.embeddings.create(model="bag-embed", input=[*texts, texts[0]])
    v = [d.embedding for d in r.data]
    assert {len(x) for x in v} == {64}
    assert math.isclose(_dot(v[0], v[3]), 1.0, rel_tol=1e-5)
    assert _dot(v[0], v[1]) > _dot(v[0], v[2]) + 0.3  # shared words, far closer
    with pytest.raises(openai.NotFoundError):  # it embeds; it does not answer
        client.responses.create(model="bag-embed", input="hi", max_output_tokens=4)
    # the chat model beside it embeds under its own id, with its own width
    chat = client.embeddings.create(model=MODEL_ID, input="hello", encoding_format="float")
    assert len(chat.data[0].embedding) == 576
