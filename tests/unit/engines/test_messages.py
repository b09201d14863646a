"""Turns as ordered parts: text-only turns render exactly as their text did (prompt caches
depend on it), images render as the prompter's marker where they sit, and templates get
images on user turns only."""

from __future__ import annotations

import pytest

from respd.engines.base import PromptRequest
from respd.engines.chat_template import FALLBACK_TEMPLATE, ChatTemplate
from respd.engines.fake import FakeEngine
from respd.engines.families.tools import generic_messages
from respd.engines.messages import (
    ATTACHED_LINE,
    ChatMessage,
    Image,
    TextPart,
    ToolCall,
    images_on_user_turns,
)
from respd.engines.prompting import MEDIA_MARKER

RED = Image(b"red", "image/png")
TOOLS = [{"type": "function", "function": {"name": "f"}}]


def render(messages: list[ChatMessage]) -> str:
    return ChatTemplate(FALLBACK_TEMPLATE).render(
        [m.as_template_dict(MEDIA_MARKER) for m in messages]
    )


def test_a_string_is_one_text_part_and_none_when_empty() -> None:
    assert ChatMessage("user", "hi").content == [TextPart("hi")]
    assert ChatMessage("user", "").content == []
    assert ChatMessage("user", ["a", RED]).content == [TextPart("a"), RED]


def test_text_parts_render_as_the_text_joined_by_newlines() -> None:
    parts = [ChatMessage("system", ["be", "", "brief"]), ChatMessage("user", ["a", "b"])]
    joined = [ChatMessage("system", "be\n\nbrief"), ChatMessage("user", "a\nb")]
    assert render(parts) == render(joined)
    for tools in (None, TOOLS):
        assert render(generic_messages(parts, tools)) == render(generic_messages(joined, tools))


def test_an_empty_system_turn_takes_the_tool_prompt_as_before() -> None:
    [system, _] = generic_messages([ChatMessage("system", ""), ChatMessage("user", "x")], TOOLS)
    assert system.text.startswith("\n\n# Tools")


def test_an_image_renders_as_the_marker_in_place_and_needs_one() -> None:
    turn = ChatMessage("user", ["Compare", RED, "with the first."])
    assert turn.rendered(MEDIA_MARKER) == f"Compare\n{MEDIA_MARKER}\nwith the first."
    assert turn.text == "Compare\nwith the first." and turn.images == [RED]
    with pytest.raises(ValueError):
        turn.as_template_dict()


def test_images_move_to_a_user_turn_after_other_roles() -> None:
    call = ToolCall("c1", "shot", "{}")
    moved = images_on_user_turns(
        [
            ChatMessage("user", ["look", RED]),
            ChatMessage("assistant", ["see", RED], tool_calls=[call]),
            ChatMessage("tool", [RED, "done"], tool_call_id="c1", name="shot"),
        ]
    )
    assert [(m.role, m.rendered("<i>")) for m in moved] == [
        ("user", "look\n<i>"),
        ("assistant", "see"),
        ("user", "<i>"),
        ("tool", f"done\n{ATTACHED_LINE}"),
        ("user", "<i>"),
    ]
    assert moved[1].tool_calls == [call] and moved[3].tool_call_id == "c1"


async def test_the_fake_engine_places_image_positions_at_the_marker() -> None:
    engine = FakeEngine(vision=True)
    prompt = await engine.prepare(PromptRequest([ChatMessage("user", ["a", RED, "b"])]))
    assert prompt.images == [RED] and prompt.tokens.count(-1) == 4
