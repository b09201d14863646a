"""The playground page in Chromium against a real respd: streaming, a forced function call
answered in its card, an attached file, a chat continued after a reload, a background
response followed across a reload, API keys, --no-ui, and a phone-width layout.

What the page sent is checked on the server's side: the stored responses are fetched over
HTTP and their chaining and input read from there."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Locator, Page, ViewportSize, expect

from tests.browser.conftest import API_KEY
from tests.support.mcp_server import McpTestServer
from tests.support.servers import MODEL_ID, RespdServer

ENDED = re.compile("^(completed|incomplete)$")
ROLLS = re.compile(r'^\{"rolls":\[[0-9,]+\],"total":\d+\}$')
# Records the first answer's length at every change until its response has ended.
WATCH_LENGTHS = """() => {
    window.lengths = [];
    const transcript = document.getElementById("transcript");
    new MutationObserver(() => {
        const turn = transcript.querySelector("article.turn");
        const text = turn && turn.querySelector(".message .text");
        if (text && !["completed", "incomplete"].includes(turn.dataset.status)) {
            window.lengths.push(text.textContent.length);
        }
    }).observe(transcript, {subtree: true, childList: true, characterData: true});
}"""


def _open(page: Page, server: RespdServer) -> None:
    page.goto(server.base_url + "/")
    expect(page.locator("#model option").first).to_have_text(MODEL_ID)


def _send(page: Page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def _ended(page: Page, nth: int) -> Locator:
    """The nth turn (from 0), once its response has ended."""
    turn = page.locator("article.turn").nth(nth)
    expect(turn).to_have_attribute("data-status", ENDED, timeout=90_000)
    return turn


def _id(turn: Locator) -> str:
    response_id = turn.get_attribute("data-response-id")
    assert response_id
    return response_id


def _stored(server: RespdServer, path: str, key: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answer = httpx.get(f"{server.base_url}/v1/responses/{path}", headers=headers, timeout=30)
    answer.raise_for_status()
    return answer.json()


def test_a_message_streams_in(page: Page, server: RespdServer) -> None:
    _open(page, server)
    page.evaluate(WATCH_LENGTHS)
    _send(page, "Count from one to twenty.")
    turn = _ended(page, 0)
    lengths = page.evaluate("window.lengths")
    assert len({n for n in lengths if n > 0}) > 1, f"the text did not grow: {lengths}"
    assert turn.locator(".message .text").inner_text().strip()
    stats = turn.locator(".stats").inner_text()
    assert "cached" in stats and "first token" in stats and "tokens/s" in stats, stats
    page.click("#toggle-raw")
    expect(page.locator("#raw-log")).to_contain_text("event: response.output_text.delta")


def test_a_forced_function_call_is_answered_in_its_card(page: Page, server: RespdServer) -> None:
    _open(page, server)
    page.select_option("#tool-choice", "roll_dice")
    _send(page, "Roll two six-sided dice.")
    first = _ended(page, 0)
    card = first.locator("section.function-call")
    expect(card).to_contain_text("roll_dice")
    output = card.locator("textarea")
    expect(output).to_have_value(ROLLS)  # the page ran its demo tool
    output.fill("The dice show 3 and 4.")
    card.get_by_role("button", name="Send output").click()
    second = _ended(page, 1)
    expect(second.locator(".message")).to_have_count(1)
    stored = _stored(server, _id(second))
    assert stored["previous_response_id"] == _id(first)
    items = _stored(server, _id(second) + "/input_items")["data"]
    assert [(i["type"], i["output"]) for i in items] == [
        ("function_call_output", "The dice show 3 and 4.")
    ]


def test_an_attached_file_is_uploaded_and_sent(
    page: Page, server: RespdServer, tmp_path: Path
) -> None:
    note = tmp_path / "note.txt"
    note.write_text("The password is avocado.\n")
    _open(page, server)
    page.set_input_files("#file-input", str(note))
    expect(page.locator("#attachments")).to_contain_text("note.txt")
    _send(page, "What is the password?")
    turn = _ended(page, 0)
    expect(turn.locator(".user")).to_contain_text("[file note.txt]")
    items = _stored(server, _id(turn) + "/input_items")["data"]
    parts = {p["type"]: p for p in items[0]["content"]}
    assert set(parts) == {"input_text", "input_file"}
    uploaded = httpx.get(f"{server.base_url}/v1/files/{parts['input_file']['file_id']}").json()
    assert (uploaded["filename"], uploaded["purpose"]) == ("note.txt", "user_data")


def test_a_chat_continues_after_a_reload(page: Page, server: RespdServer) -> None:
    _open(page, server)
    _send(page, "Say hello.")
    first_id = _id(_ended(page, 0))
    page.reload()
    expect(page.locator("article.turn")).to_have_count(1)  # reopened from the server
    expect(page.locator("#history-list li")).to_have_count(1)
    _send(page, "Say goodbye.")
    second_id = _id(_ended(page, 1))
    assert _stored(server, second_id)["previous_response_id"] == first_id


def test_a_background_response_is_followed_across_a_reload(page: Page, server: RespdServer) -> None:
    _open(page, server)
    page.check("#background")
    page.fill("#max-output-tokens", "400")
    page.fill("#temperature", "0")
    # Greedy, this prompt runs to the cap: seconds, long enough to reload in the middle.
    _send(page, "Write a long story about a dragon and a knight, with many chapters.")
    text = page.locator("article.turn .message .text").first
    expect(text).not_to_be_empty()
    page.reload()
    turn = page.locator("article.turn").first
    expect(turn).to_have_attribute("data-resumed", "true")  # it was still running
    _ended(page, 0)
    stored = _stored(server, _id(turn))
    assert stored["background"] is True
    final = turn.locator(".message .text").inner_text()
    assert final == "".join(
        part["text"]
        for item in stored["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
    assert final.strip()


def test_a_wrong_api_key_shows_the_servers_error(page: Page, keyed_server: RespdServer) -> None:
    page.goto(keyed_server.base_url + "/")
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()  # the first 401 asks for a key
    page.fill("#key-input", "sk-wrong")
    page.click("#key-ok")
    refusal = httpx.get(
        keyed_server.base_url + "/v1/models", headers={"Authorization": "Bearer sk-wrong"}
    )
    assert refusal.status_code == 401
    expect(page.locator("#banner")).to_have_text(refusal.json()["error"]["message"])
    expect(dialog).to_be_hidden()  # asked once, not again
    page.click("#set-key")
    page.fill("#key-input", API_KEY)
    page.click("#key-ok")
    expect(page.locator("#model option").first).to_have_text(MODEL_ID)
    expect(page.locator("#banner")).to_be_hidden()
    _send(page, "Say hi.")
    turn = _ended(page, 0)
    assert _stored(keyed_server, _id(turn), key=API_KEY)["status"] in ("completed", "incomplete")


def test_no_ui_answers_404_at_the_root(page: Page, no_ui_server: RespdServer) -> None:
    answer = page.goto(no_ui_server.base_url + "/")
    assert answer is not None and answer.status == 404
    assert answer.json()["error"]["code"] == "unknown_url"
    assert httpx.get(no_ui_server.base_url + "/health").status_code == 200


PHONE: ViewportSize = {"width": 375, "height": 740}


@pytest.mark.parametrize("viewport", [PHONE])
def test_the_composer_works_at_phone_width(page: Page, server: RespdServer) -> None:
    _open(page, server)
    for panel in ("#history", "#settings", "#raw"):
        expect(page.locator(panel)).to_be_hidden()  # collapsed behind the header's buttons
    composer = page.locator("#composer").bounding_box()
    assert composer is not None and composer["x"] >= 0
    assert composer["x"] + composer["width"] <= PHONE["width"]
    page.focus("#input")
    page.keyboard.type("Hello")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("there")
    expect(page.locator("#input")).to_have_value("Hello\nthere")
    page.keyboard.press("Enter")
    _ended(page, 0)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page scrolls sideways: {width}px"
    page.click("#toggle-settings")
    expect(page.locator("#settings")).to_be_visible()


def test_a_conversation_is_continued_after_a_reload_and_deleted(
    page: Page, server: RespdServer
) -> None:
    _open(page, server)
    page.check("#use-conversation")
    _send(page, "Say hello.")
    _ended(page, 0)
    page.reload()
    expect(page.locator("article.turn")).to_have_count(1)  # drawn from the conversation
    _send(page, "Say goodbye.")
    second = _ended(page, 1)
    conversation = _stored(server, _id(second))["conversation"]["id"]
    url = f"{server.base_url}/v1/conversations/{conversation}"
    items = httpx.get(url + "/items?order=asc").json()["data"]
    said = [p["text"] for i in items if i.get("role") == "user" for p in i["content"]]
    assert said == ["Say hello.", "Say goodbye."]
    page.get_by_role("button", name="Delete Say hello.").click()
    expect(page.locator("#history-list li")).to_have_count(0)
    expect(page.locator("article.turn")).to_have_count(0)
    assert httpx.get(url).status_code == 404


def test_an_error_answer_is_shown(page: Page, server: RespdServer) -> None:
    _open(page, server)
    page.fill("#temperature", "7")
    _send(page, "Hi.")
    refusal = httpx.post(
        f"{server.base_url}/v1/responses",
        json={"model": MODEL_ID, "input": "Hi.", "temperature": 7},
    )
    assert refusal.status_code == 400
    expect(page.locator("article.turn .turn-error")).to_have_text(
        refusal.json()["error"]["message"]
    )


# One PNG pixel, dropped on the composer as a file: the page sends it inline as a data URL.
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAF"
    "BQIAX8jx0gAAAABJRU5ErkJggg=="
)
DROP_IMAGE = """async (pixel) => {
    const bytes = Uint8Array.from(atob(pixel), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], "dot.png", {type: "image/png"}));
    const composer = document.getElementById("composer");
    composer.dispatchEvent(new DragEvent("dragover", {dataTransfer: data, bubbles: true}));
    composer.dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true}));
}"""


def test_a_dropped_image_is_sent_inline(page: Page, server: RespdServer) -> None:
    _open(page, server)
    page.evaluate(DROP_IMAGE, PIXEL)
    expect(page.locator("#attachments")).to_contain_text("image: dot.png")
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.method == "POST" else None)
    _send(page, "What is in this picture?")
    # The embedded model has no vision projector: the server's refusal is shown.
    expect(page.locator("article.turn .turn-error")).to_contain_text("has no image input")
    parts = sent[0]["input"][0]["content"]
    assert parts[0] == {"type": "input_text", "text": "What is in this picture?"}
    assert parts[1]["type"] == "input_image"
    assert parts[1]["image_url"].startswith("data:image/png;base64,")


def test_a_server_tool_is_approved_in_its_card_and_runs(
    page: Page, server: RespdServer, mcp: McpTestServer
) -> None:
    _open(page, server)
    tool = {"type": "mcp", "server_label": "facts", "server_url": mcp.url, "allowed_tools": ["add"]}
    choice = {"type": "mcp", "server_label": "facts", "name": "add"}
    # One call, so one card to approve (left free, the model may add a second call).
    extra = {"tools": [tool], "tool_choice": choice, "parallel_tool_calls": False}
    page.fill("#extra", json.dumps(extra))
    page.fill("#max-output-tokens", "200")  # the call, then an answer
    _send(page, "Add 20 and 22.")
    first = _ended(page, 0)
    expect(first.locator("[data-type=mcp_list_tools]")).to_contain_text("facts")
    request = first.locator("[data-type=mcp_approval_request]")
    expect(request).to_contain_text("add")
    request.get_by_role("button", name="Approve").click()
    second = _ended(page, 1)
    call = second.locator("[data-type=mcp_call]")
    expect(call).to_contain_text("status: completed")
    stored = _stored(server, _id(second))
    assert stored["previous_response_id"] == _id(first)
    done = stored["output"][0]
    assert done["type"] == "mcp_call"
    args = json.loads(done["arguments"])
    assert done["output"] == str(args["a"] + args["b"])
