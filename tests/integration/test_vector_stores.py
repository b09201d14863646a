"""The Vector Stores API on real servers, through the `openai` SDK: three uploaded
documents indexed in the background, searched over HTTP, one key's stores invisible to
another; on SQLite with an embedding model (hybrid search) and on PostgreSQL without one
(full-text only). One server per store for the whole module."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import openai
import pytest

from respd.config.engine import embedded_model_path
from tests.support.gguf.embedder import write_embedding_model
from tests.support.pg import fresh_schema
from tests.support.servers import RespdServer, start_server

KEY_A, KEY_B = "sk-vs-alice", "sk-vs-bob"
DOCS = {
    "cars.txt": "My sedan broke down on the highway, so a mechanic towed it to the garage "
    "for repairs.",
    "cooking.md": "# Risotto\n\nStir the rice slowly and add warm stock, one ladle at a time, "
    "until it is creamy. The lighthouse keeper's secret: a zeppelin-sized knob of butter.",
    "garden.pdf": "",  # made below: a real PDF, read by the document readers
}
GARDEN = "Prune the roses in early spring, before the new buds open, and water the beds."


def _pdf(text: str) -> bytes:
    """A one-page PDF whose content stream shows `text` in Helvetica."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


@pytest.fixture(scope="module", params=["sqlite-hybrid", "postgresql"])
def vs_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp(f"respd-vs-{request.param}")
    with ExitStack() as exits:
        keys = ("--api-key", f"{KEY_A},{KEY_B}")
        if request.param == "postgresql":
            dsn = exits.enter_context(fresh_schema())
            srv = start_server(tmp, "--store", dsn, *keys, preset="compact")
        else:
            gguf = write_embedding_model(tmp / "bag-embed.gguf", embedded_model_path())
            srv = start_server(
                tmp,
                *("--store", "sqlite", "--data-dir", str(tmp / "data"), *keys),
                *("--embedding-model", str(gguf), "--file-search-embedding-model", "bag-embed"),
                preset="compact",
            )
        yield srv
        srv.stop()
        srv.assert_no_5xx()


def _client(server: RespdServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def _indexed(client: openai.OpenAI) -> tuple[str, dict[str, str]]:
    """A vector store over the three documents, once every file is indexed."""
    ids = {}
    for name, text in DOCS.items():
        content = _pdf(GARDEN) if name.endswith(".pdf") else text.encode()
        ids[name] = client.files.create(file=(name, content), purpose="assistants").id
    store = client.vector_stores.create(name="docs", file_ids=list(ids.values()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = list(client.vector_stores.files.list(store.id))
        if files and all(f.status != "in_progress" for f in files):
            break
        time.sleep(0.1)
    assert {f.id: f.status for f in files} == dict.fromkeys(ids.values(), "completed")
    return store.id, ids


def test_the_fact_one_document_holds_ranks_first(vs_server: RespdServer) -> None:
    client = _client(vs_server, KEY_A)
    store_id, ids = _indexed(client)
    store = client.vector_stores.retrieve(store_id)
    assert store.status == "completed" and store.file_counts.completed == 3
    assert store.usage_bytes > 0
    hits = client.vector_stores.search(store_id, query="who towed the sedan?").data
    assert hits[0].file_id == ids["cars.txt"] and hits[0].filename == "cars.txt"
    assert "mechanic" in hits[0].content[0].text and 0 < hits[0].score <= 1
    pdf = client.vector_stores.search(store_id, query="prune roses", max_num_results=1).data
    assert [h.file_id for h in pdf] == [ids["garden.pdf"]]
    assert pdf[0].content[0].text.startswith("Prune the roses")
    text = client.vector_stores.files.content(ids["garden.pdf"], vector_store_id=store_id)
    assert [c.text for c in text] == [pdf[0].content[0].text]
    client.vector_stores.files.update(
        ids["cars.txt"], vector_store_id=store_id, attributes={"topic": "cars"}
    )
    only_cars = client.vector_stores.search(
        store_id, query="garage roses rice", filters={"type": "eq", "key": "topic", "value": "cars"}
    ).data
    assert {h.file_id for h in only_cars} == {ids["cars.txt"]}


def test_another_key_cannot_see_the_store(vs_server: RespdServer) -> None:
    alice, bob = _client(vs_server, KEY_A), _client(vs_server, KEY_B)
    store = alice.vector_stores.create(name="private")
    with pytest.raises(openai.NotFoundError):
        bob.vector_stores.retrieve(store.id)
    with pytest.raises(openai.NotFoundError):
        bob.vector_stores.search(store.id, query="anything")
    with pytest.raises(openai.NotFoundError):
        bob.vector_stores.delete(store.id)
    assert store.id not in {s.id for s in bob.vector_stores.list()}
    assert alice.vector_stores.retrieve(store.id).name == "private"
    assert alice.vector_stores.delete(store.id).deleted


def test_vector_similarity_finds_what_no_word_matches(vs_server: RespdServer) -> None:
    """'automobile' is in no document. Full-text search alone finds nothing; with the
    embedding model the vector ranking alone orders the hits (each scores at most 0.5:
    first in one of two rankings). The test model is a bag of tokens from a fixed seed
    (tests/support/gguf/embedder.py), under which 'automobile' lies nearest cars.txt."""
    client = _client(vs_server, KEY_A)
    store_id, ids = _indexed(client)
    hits = client.vector_stores.search(store_id, query="automobile").data
    if "--file-search-embedding-model" not in vs_server.args:
        assert hits == []
        return
    assert hits[0].file_id == ids["cars.txt"]
    assert all(0 < h.score <= 0.5 for h in hits) and len(hits) == 3
