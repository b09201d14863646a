"""Every error case: OpenAI's error body, the right status, `x-request-id`, never a 5xx."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.servers import MODEL_ID


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers.get("x-request-id")
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err  # type: ignore[no-any-return]


def _create(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/responses", json={"model": MODEL_ID, **body})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": "   \n\t"}, "input"),
        ({"input": []}, "input"),
        ({}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "  "}]}]}, "input"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "max_output_tokens": -5}, "max_output_tokens"),
        ({"input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"input": "hi", "metadata": {"k" * 65: "v"}}, "metadata"),
        ({"input": "hi", "metadata": {"k": "v" * 513}}, "metadata"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": "hi", "top_p": 1.5}, "top_p"),
        ({"input": "hi", "temperature": "hot"}, "temperature"),
        ({"input": "hi", "truncation": "sometimes"}, "truncation"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"role": "user"}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"type": "bogus"}]}]}, "input[0].content[0].type"),
        ({"input": [{"type": "weird_item"}]}, "input[0].type"),
        ({"input": "hi", "include": ["not.a.thing"]}, "include"),
    ],
)
def test_invalid_requests_are_400_naming_the_param(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    err = _error(_create(http, **body), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


def test_blank_input_with_instructions_passes(http: httpx.Client) -> None:
    r = _create(http, input="", instructions="Greet the user.", max_output_tokens=2)
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "computer_use_2049"}]}, "tools[0].type"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_not_yet_implemented_fields_are_named_400s(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    body.setdefault("input", "hi")
    err = _error(_create(http, **body), 400)
    assert err["param"] == param


def test_image_input_on_text_model_names_the_model(http: httpx.Client) -> None:
    # A valid 1x1 PNG: the image is checked first, then the model's capability.
    png = (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAF"
        "BQIAX8jx0gAAAABJRU5ErkJggg=="
    )
    img = {"type": "input_image", "image_url": f"data:image/png;base64,{png}", "detail": "auto"}
    err = _error(_create(http, input=[{"role": "user", "content": [img]}]), 400)
    assert MODEL_ID in err["message"] and "image" in err["message"]
    assert (err["param"], err["code"]) == ("input[0].content[0]", "unsupported_input")


def test_unknown_file_id_in_input_file_is_a_404(http: httpx.Client) -> None:
    part = {"type": "input_file", "file_id": "file-unknown"}
    err = _error(_create(http, input=[{"role": "user", "content": [part]}]), 404)
    assert err["param"] == "input[0].content[0].file_id"


def test_unknown_fields_are_ignored(http: httpx.Client) -> None:
    r = _create(http, input="hi", max_output_tokens=2, some_future_field={"x": 1})
    assert r.status_code == 200


def test_malformed_json_and_wrong_body_type(http: httpx.Client) -> None:
    r = http.post(
        "/v1/responses", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert _error(r, 400)["code"] == "invalid_json"
    r = http.post("/v1/responses", json=[1, 2])
    _error(r, 400)
    r = http.post(
        "/v1/chat/completions", content=b"\xff\xfe", headers={"content-type": "application/json"}
    )
    _error(r, 400)


def test_missing_model_and_unknown_model(http: httpx.Client, client: openai.OpenAI) -> None:
    err = _error(http.post("/v1/responses", json={"input": "hi"}), 400)
    assert err["param"] == "model" and err["code"] == "missing_required_parameter"
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="no-such-model", input="hi")
    assert exc.value.code == "model_not_found"
    assert exc.value.request_id
    err = _error(
        http.post(
            "/v1/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
        ),
        404,
    )
    assert err["code"] == "model_not_found"
    assert _error(http.get("/v1/models/nope"), 404)["code"] == "model_not_found"


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert _error(http.get("/v1/does-not-exist"), 404)["code"] == "unknown_url"
    assert _error(http.post("/v1/nothing/here", json={}), 404)["type"] == "invalid_request_error"
    _error(http.delete("/v1/models"), 405)


def test_streaming_validation_errors_are_plain_http_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL_ID, input="", stream=True)
    assert exc.value.param == "input"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": " "}]}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]},
            "stop",
        ),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_chat_invalid_requests(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    err = _error(http.post("/v1/chat/completions", json={"model": MODEL_ID, **body}), 400)
    assert err["param"] == param


def test_chat_context_overflow(http: httpx.Client) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "word " * 3000}]}
    err = _error(http.post("/v1/chat/completions", json=body), 400)
    assert err["code"] == "context_length_exceeded"
