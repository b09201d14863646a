"""The Conversations API through the SDK, and responses that continue a conversation."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai.types.conversations import Conversation, ConversationItem
from pydantic import TypeAdapter

from tests.support.servers import MODEL_ID, RespdServer
from tests.support.stateful import create

ITEM = TypeAdapter(ConversationItem)


def _strict_conv(conv: Any) -> Conversation:
    return Conversation.model_validate(conv.to_dict())


def test_conversation_crud(sclient: openai.OpenAI, stateful_server: RespdServer) -> None:
    conv = _strict_conv(
        sclient.conversations.create(
            items=[
                {"type": "message", "role": "user", "content": "first"},
                {"type": "message", "role": "assistant", "content": "second"},
            ],
            metadata={"topic": "test"},
        )
    )
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "test"}
    assert _strict_conv(sclient.conversations.retrieve(conv.id)) == conv
    updated = sclient.conversations.update(conv.id, metadata={"topic": "changed"})
    assert updated.metadata == {"topic": "changed"}

    added = sclient.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "third"}]
    )
    assert len(added.data) == 1
    third_id = added.data[0].id

    listed = [
        ITEM.validate_python(i.to_dict())
        for i in sclient.conversations.items.list(conv.id, order="asc", limit=2)
    ]
    texts = [i.content[0].text for i in listed]  # type: ignore[union-attr]
    assert texts == ["first", "second", "third"]
    desc = sclient.conversations.items.list(conv.id)
    assert [i.id for i in desc.data] == [i.id for i in reversed(listed)]

    item = sclient.conversations.items.retrieve(third_id, conversation_id=conv.id)
    assert item.id == third_id
    after_delete = sclient.conversations.items.delete(third_id, conversation_id=conv.id)
    assert after_delete.id == conv.id and after_delete.object == "conversation"
    with pytest.raises(openai.NotFoundError):
        sclient.conversations.items.retrieve(third_id, conversation_id=conv.id)

    with httpx.Client(base_url=stateful_server.base_url) as http:
        deleted = http.delete(f"/conversations/{conv.id}")  # alias without /v1
        assert deleted.json() == {"id": conv.id, "object": "conversation.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        sclient.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        sclient.conversations.items.list(conv.id)


def test_two_turns_through_conversation(sclient: openai.OpenAI) -> None:
    conv = sclient.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}]
    )
    one = create(sclient, "Hello.", conversation=conv.id)
    assert one.conversation is not None and one.conversation.id == conv.id
    two = create(sclient, "What is my name?", conversation={"id": conv.id})
    items = list(sclient.conversations.items.list(conv.id, order="asc"))
    roles = [i.role for i in items]  # type: ignore[union-attr]
    assert roles == ["user", "user", "assistant", "user", "assistant"]
    assert items[2].id == one.output[0].id and items[4].id == two.output[0].id
    # The second turn saw every earlier item: its prompt equals the history spelled out.
    spelled: Any = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": one.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    by_hand = sclient.responses.input_tokens.count(model=MODEL_ID, input=spelled)
    assert two.usage is not None and by_hand.input_tokens == two.usage.input_tokens
    via_conv = sclient.responses.input_tokens.count(
        model=MODEL_ID, input="Anything else?", conversation=conv.id
    )
    assert via_conv.input_tokens > two.usage.input_tokens


def test_conversation_errors(sclient: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        sclient.conversations.retrieve("conv_nope")
    with pytest.raises(openai.BadRequestError) as err:
        sclient.conversations.create(items=[{"type": "message", "role": "robot", "content": "x"}])  # type: ignore[list-item, typeddict-item]
    assert err.value.status_code == 400
    too_many: Any = [{"type": "message", "role": "user", "content": "x"}] * 21
    with pytest.raises(openai.BadRequestError):
        sclient.conversations.create(items=too_many)
    conv = sclient.conversations.create()
    with pytest.raises(openai.NotFoundError):
        sclient.conversations.items.delete("msg_nope", conversation_id=conv.id)
