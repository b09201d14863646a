"""State resolution: the prior items a request continues from.

`previous_response_id` replays the whole chain (A → B → C: C sees A's input and output, then
B's, then its own input); `conversation` replays the conversation's items. `instructions` are
never inherited: they are not items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from respd.protocol.errors import InvalidRequest, NotFound
from respd.protocol.responses import ConversationRef
from respd.store.base import JSON, ResponseRecord, Store

MAX_CHAIN = 10_000  # a guard against a cycle in a damaged store, far above any real chain


@dataclass
class History:
    items: list[JSON] = field(default_factory=list)
    conversation_id: str | None = None
    # What names the conversation across its turns: the first response of the
    # `previous_response_id` chain, or the conversation's id (None for a first turn).
    root_id: str | None = None


def conversation_id_of(conversation: str | ConversationRef | None) -> str | None:
    if conversation is None:
        return None
    return conversation if isinstance(conversation, str) else conversation.id


def previous_not_found(response_id: str) -> NotFound:
    return NotFound(
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def conversation_not_found(conversation_id: str, param: str = "conversation") -> NotFound:
    return NotFound(
        f"Conversation with id '{conversation_id}' not found.",
        param=param,
        code="conversation_not_found",
    )


async def chain_of(store: Store, owner: str, response_id: str) -> list[ResponseRecord]:
    """The response and its ancestors, oldest first (a deleted ancestor ends the chain)."""
    record = await store.get_response(owner, response_id)
    if record is None:
        raise previous_not_found(response_id)
    chain = [record]
    seen = {record.id}
    while chain[-1].previous_response_id and len(chain) < MAX_CHAIN:
        parent = await store.get_response(owner, chain[-1].previous_response_id)
        if parent is None or parent.id in seen:
            break
        chain.append(parent)
        seen.add(parent.id)
    return list(reversed(chain))


async def resolve_history(
    store: Store,
    owner: str,
    *,
    previous_response_id: str | None,
    conversation: str | ConversationRef | None,
) -> History:
    conversation_id = conversation_id_of(conversation)
    if previous_response_id is not None and conversation_id is not None:
        raise InvalidRequest(
            "Mutually exclusive parameters: 'previous_response_id' and 'conversation' cannot "
            "be used together.",
            param="conversation",
            code="mutually_exclusive_parameters",
        )
    if previous_response_id is not None:
        items: list[JSON] = []
        chain = await chain_of(store, owner, previous_response_id)
        for record in chain:
            items += record.input_items + record.output
        return History(items, root_id=chain[0].id)
    if conversation_id is not None:
        conv_items = await store.conversation_items(owner, conversation_id)
        if conv_items is None:
            raise conversation_not_found(conversation_id)
        return History(conv_items, conversation_id, root_id=conversation_id)
    return History()
