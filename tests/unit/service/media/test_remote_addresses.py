"""With `--allow-remote-media`, a URL whose host spells a loopback, private or reserved
address in any form a resolver or browser reads (octal, hex, one to four parts, a trailing
dot, percent-escapes, full-width digits, IPv6-mapped, 6to4) is a 400 naming the part, and
no connection is made; a URL httpx cannot parse is a 400 too, never a 500."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from respd.api.app import create_app
from respd.engines.fake import FakeEngine
from respd.service.media.fetch import address_refused, literal_address
from respd.service.media.settings import MediaSettings
from tests.support.fake import FAKE_MODEL

SPELLINGS = [
    "127.0.0.1",
    "0177.0.0.1",
    "0x7f.0.0.1",
    "0x7f.0x0.0x0.0x1",
    "0x7f000001",
    "2130706433",
    "017700000001",
    "127.1",
    "127.0.1",
    "127.000.000.001",
    "127.0.0.1.",
    "%31%32%37.0.0.1",
    "\uff11\uff12\uff17.0.0.1",  # full-width digits
    "0",
    "0.0.0.0",
    "0300.0250.0.1",  # 192.168.0.1
    "[::1]",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "[::127.0.0.1]",
    "[2002:7f00:1::]",  # 6to4 of 127.0.0.1
    "[fe80::1%25lo]",
]


@pytest.mark.parametrize("host", SPELLINGS)
def test_every_spelling_of_a_refused_address_is_read_as_that_address(host: str) -> None:
    address = literal_address(host)
    assert address is not None and address_refused(address)


@pytest.mark.parametrize("host", ["example.com", "localhost", "a.0x7f", "1.2.3.4.5"])
def test_host_names_are_left_to_the_resolver(host: str) -> None:
    assert literal_address(host) is None


@pytest.fixture()
def listener() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback port that records every connection made to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


async def test_loopback_spellings_are_400s_with_no_connection_made(
    listener: tuple[int, list[socket.socket]],
) -> None:
    port, accepted = listener
    engine = FakeEngine(model_id=FAKE_MODEL)
    app = create_app(engine, media=MediaSettings(allow_remote_media=True))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as http:
        for host in [*SPELLINGS, "[not-an-address", "\u2460\u2461\u2466.0.0.1"]:
            url = f"http://{host}:{port}/a.png"
            part = {"type": "input_image", "image_url": url}
            body = {"model": FAKE_MODEL, "input": [{"role": "user", "content": [part]}]}
            r = await http.post("/v1/responses", json=body)
            assert r.status_code == 400, (host, r.text)
            assert r.json()["error"]["param"] == "input[0].content[0].image_url", r.text
    assert accepted == [] and engine.calls == []
