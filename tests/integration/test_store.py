"""Stored responses through the SDK, against both stores: retrieve, delete, input items,
`previous_response_id` chains, `store: false`, `input_tokens`, and OpenAI-shaped errors."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import ResponseItem
from pydantic import TypeAdapter

from tests.support.servers import MODEL_ID, RespdServer
from tests.support.stateful import create, strict, strict_event

ITEM = TypeAdapter(ResponseItem)


def test_retrieve_returns_the_created_object(sclient: openai.OpenAI) -> None:
    created = create(sclient, metadata={"k": "v"})
    got = strict(sclient.responses.retrieve(created.id))
    assert got.model_dump() == created.model_dump()
    assert got.store is True and got.metadata == {"k": "v"}


def test_streamed_ids_are_the_stored_ids(sclient: openai.OpenAI) -> None:
    with sclient.responses.stream(
        model=MODEL_ID, input="Say hi.", max_output_tokens=6, temperature=0
    ) as stream:
        events = [strict_event(e) for e in stream]
    final = events[-1].response
    stored = strict(sclient.responses.retrieve(final.id))
    assert stored.model_dump() == strict(final).model_dump()
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [item.id for item in stored.output]


def test_delete_then_404(sclient: openai.OpenAI, stateful_server: RespdServer) -> None:
    created = create(sclient)
    with httpx.Client(base_url=stateful_server.base_url) as http:
        deleted = http.delete(f"/v1/responses/{created.id}")
        assert deleted.json() == {"id": created.id, "object": "response.deleted", "deleted": True}
        gone = http.delete(f"/responses/{created.id}")  # the alias without /v1
        assert gone.status_code == 404
    with pytest.raises(openai.NotFoundError) as err:
        sclient.responses.retrieve(created.id)
    assert err.value.body["message"] == f"Response with id '{created.id}' not found."  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        sclient.responses.input_items.list(created.id)


def test_input_items_pagination_both_orders(sclient: openai.OpenAI) -> None:
    texts = [f"note {i}" for i in range(5)]
    items: list[Any] = [{"role": "user", "content": t} for t in texts[:-1]]
    items.append(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": texts[-1]}]}
    )
    created = create(sclient, items)

    def collect(order: str) -> list[Any]:
        page = sclient.responses.input_items.list(created.id, order=order, limit=2)  # type: ignore[arg-type]
        assert len(page.data) == 2 and page.has_more
        return [ITEM.validate_python(i.to_dict()) for i in page]  # auto-paginates

    asc = collect("asc")
    desc = collect("desc")
    assert [i.content[0].text for i in asc] == texts
    assert [i.id for i in desc] == [i.id for i in reversed(asc)]
    assert len({i.id for i in asc}) == 5 and all(i.id.startswith("msg_") for i in asc)
    default = sclient.responses.input_items.list(created.id)
    assert [i.id for i in default.data] == [i.id for i in desc]  # desc by default
    assert default.first_id == desc[0].id and default.last_id == desc[-1].id  # type: ignore[attr-defined]
    # Stable ids: listing again gives the same ones.
    again = sclient.responses.input_items.list(created.id, order="asc", limit=100)
    assert [i.id for i in again.data] == [i.id for i in asc]


def _messages(response: Any) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": response.output_text}]


def test_three_step_chain_replays_every_turn(sclient: openai.OpenAI) -> None:
    a = create(sclient, "My name is Ada.", instructions="Answer in one word.")
    b = create(sclient, "I live in Paris.", previous_response_id=a.id)
    c = create(sclient, "What is my name?", previous_response_id=b.id)
    assert c.previous_response_id == b.id and c.instructions is None
    # The same conversation spelled out by hand (no instructions: they are not inherited).
    explicit = [
        {"role": "user", "content": "My name is Ada."},
        *_messages(a),
        {"role": "user", "content": "I live in Paris."},
        *_messages(b),
        {"role": "user", "content": "What is my name?"},
    ]
    by_hand = sclient.responses.input_tokens.count(model=MODEL_ID, input=explicit)  # type: ignore[arg-type]
    chained = sclient.responses.input_tokens.count(
        model=MODEL_ID, input="What is my name?", previous_response_id=b.id
    )
    assert c.usage is not None
    assert chained.input_tokens == by_hand.input_tokens == c.usage.input_tokens
    alone = sclient.responses.input_tokens.count(model=MODEL_ID, input="What is my name?")
    assert alone.input_tokens < c.usage.input_tokens
    # input_items of C list only C's own input.
    assert [i.content[0].text for i in sclient.responses.input_items.list(c.id)] == [  # type: ignore[union-attr]
        "What is my name?"
    ]


def test_input_tokens_equals_usage(sclient: openai.OpenAI) -> None:
    turn: Any = [{"role": "user", "content": "Tell me a joke."}]
    counted = sclient.responses.input_tokens.count(
        model=MODEL_ID, input=turn, instructions="Be brief."
    )
    assert counted.object == "response.input_tokens"
    created = create(sclient, turn, instructions="Be brief.")
    assert created.usage is not None and counted.input_tokens == created.usage.input_tokens


def test_store_false_is_not_kept(sclient: openai.OpenAI) -> None:
    created = create(sclient, store=False)
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        sclient.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as err:
        create(sclient, "next", previous_response_id=created.id)
    assert err.value.code == "previous_response_not_found"
    assert err.value.param == "previous_response_id"


def test_state_errors_are_openai_shaped(sclient: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        create(sclient, previous_response_id="resp_nope")
    assert err.value.body == {  # type: ignore[comparison-overlap]
        "message": "Previous response with id 'resp_nope' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    with pytest.raises(openai.BadRequestError) as bad:
        create(sclient, previous_response_id="resp_x", conversation="conv_x")
    assert bad.value.param == "conversation"
    with pytest.raises(openai.BadRequestError) as bad:
        create(sclient, background=True, store=False)
    assert bad.value.param == "background"
    with pytest.raises(openai.NotFoundError) as nf:
        create(sclient, conversation={"id": "conv_nope"})
    assert nf.value.param == "conversation"
    plain = create(sclient)
    with pytest.raises(openai.BadRequestError):
        sclient.responses.cancel(plain.id)
    with pytest.raises(openai.BadRequestError) as bad:
        sclient.responses.input_items.list(plain.id, limit=0)
    assert bad.value.param == "limit"
    with pytest.raises(openai.BadRequestError):
        sclient.responses.input_items.list(plain.id, after="msg_unknown")
    with pytest.raises(openai.NotFoundError):
        sclient.responses.cancel("resp_nope")
    with pytest.raises(openai.BadRequestError):
        sclient.responses.retrieve(plain.id, include=["bogus"])  # type: ignore[list-item]


def test_failed_validation_stores_nothing(
    sclient: openai.OpenAI, stateful_server: RespdServer
) -> None:
    conv = sclient.conversations.create()
    with pytest.raises(openai.BadRequestError):
        sclient.responses.create(
            model=MODEL_ID,
            input=[{"role": "robot", "content": "x"}],
            conversation=conv.id,  # type: ignore[list-item]
        )
    assert sclient.conversations.items.list(conv.id).data == []
