"""The steering desk without a socket: what a steer must look like, what a finished
response's queued input becomes, the stubs of the outputs a response waits for."""

from __future__ import annotations

import pytest

from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.steering import (
    SteeringDesk,
    SteerRefused,
    check_steer,
    required_input,
)
from tests.support.fake import FAKE_MODEL


def test_a_response_that_finished_first_is_followed_all_the_same() -> None:
    desk = SteeringDesk()
    machine = ResponseEventMachine({})
    target = desk.track({"model": FAKE_MODEL, "input": "Go.", "store": False}, machine, None)
    assert (
        desk.submit(
            {"type": "response.steer", "previous_response_id": machine.id, "input": "More."}
        )
        is None
    )
    assert machine.steered and [e.type for e in machine.notices()] == ["response.steer.accepted"]
    machine.status = "completed"  # the generation ended before it reached a boundary
    outcome = desk.ended(target)
    assert outcome.successor == {
        "model": FAKE_MODEL,
        "input": [{"type": "message", "role": "user", "content": "More."}],
        "store": False,
        "previous_response_id": machine.id,
    }
    # a failed response commits nothing: its input comes back
    failing = ResponseEventMachine({})
    target = desk.track({"model": FAKE_MODEL}, failing, None)
    desk.submit({"type": "response.steer", "previous_response_id": failing.id, "input": "x"})
    failing.status = "failed"
    (refusal,) = desk.ended(target).notices
    assert refusal["error"]["code"] == "response_not_active" and refusal["steer"]["input"] == "x"


@pytest.mark.parametrize(
    "message",
    [
        {"previous_response_id": "resp_1"},
        {"previous_response_id": "", "input": "x"},
        {"previous_response_id": "resp_1", "input": [{"role": "user", "content": 3}]},
        {"previous_response_id": "resp_1", "input": [{"type": "function_call_output"}]},
        {
            "previous_response_id": "resp_1",
            "input": [{"role": "user", "content": "x", "name": "ada"}],
        },
        {"previous_response_id": "resp_1", "input": "x", "event_id": "e1"},
    ],
)
def test_anything_but_user_messages_is_invalid_input(message: dict[str, object]) -> None:
    with pytest.raises(SteerRefused) as exc:
        check_steer({"type": "response.steer", **message})
    assert exc.value.code == "invalid_input"


def test_user_messages_of_text_image_and_file_parts_pass() -> None:
    parts = [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
        {"type": "input_file", "file_id": "file_1"},
    ]
    message = {"type": "message", "role": "user", "content": parts}
    steer = {"type": "response.steer", "previous_response_id": "resp_1", "input": [message]}
    assert check_steer(steer) == ("resp_1", [message])


def test_each_client_call_leaves_a_stub() -> None:
    output = [
        {"type": "message", "role": "assistant", "content": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "g", "input": ""},
        {"type": "shell_call", "call_id": "c3", "action": {}},
        {"type": "apply_patch_call", "call_id": "c4", "operation": {}},
    ]
    assert required_input(output) == [
        {"type": "function_call_output", "call_id": "c1", "name": "f"},
        {"type": "custom_tool_call_output", "call_id": "c2"},
        {"type": "shell_call_output", "call_id": "c3"},
        {"type": "apply_patch_call_output", "call_id": "c4"},
    ]


def test_too_many_steers_are_refused() -> None:
    desk = SteeringDesk()
    machine = ResponseEventMachine({})
    desk.track({"model": FAKE_MODEL}, machine, None)
    steer = {"type": "response.steer", "previous_response_id": machine.id, "input": "x"}
    assert all(desk.submit(steer) is None for _ in range(16))
    refusal = desk.submit(steer)
    assert refusal is not None and refusal["error"]["code"] == "too_many_pending_steers"
