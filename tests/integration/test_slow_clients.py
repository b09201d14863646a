"""Connections that open and never finish a request head are closed after
`--header-timeout-secs`, bodies that trickle in are answered 408 and closed after
`--body-timeout-secs`, while the server keeps answering complete requests meanwhile."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.servers import MODEL_ID, RespdServer, start_server

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 2.0
STALLED = 50


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("respd-slow"),
        "--store",
        "memory",
        "--header-timeout-secs",
        str(HEADER_TIMEOUT),
        "--body-timeout-secs",
        str(BODY_TIMEOUT),
        preset="small",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def _closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closed `sock` (EOF or reset) before `deadline`."""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if sock.recv(4096) == b"":
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


def test_stalled_connections_are_closed_and_others_served(slow_server: RespdServer) -> None:
    socks = [socket.create_connection(("127.0.0.1", slow_server.port)) for _ in range(STALLED)]
    try:
        for i, sock in enumerate(socks):
            if i % 2:  # half a request line; the others send nothing at all
                sock.sendall(b"POST /v1/resp")
        opened = time.monotonic()
        with httpx.Client(base_url=slow_server.base_url, timeout=60) as http:
            r = http.post(
                "/v1/responses", json={"model": MODEL_ID, "input": "Hi", "max_output_tokens": 4}
            )
            assert r.status_code == 200, r.text
        deadline = opened + HEADER_TIMEOUT + 10
        still_open = [i for i, s in enumerate(socks) if not _closed_by_server(s, deadline)]
        assert not still_open, f"{len(still_open)} stalled connections were kept open"
        with httpx.Client(base_url=slow_server.base_url, timeout=10) as http:
            assert http.get("/health").status_code == 200
    finally:
        for sock in socks:
            sock.close()


def test_a_request_slower_than_the_timeout_overall_is_served(slow_server: RespdServer) -> None:
    """The deadline is for the head: a kept-alive connection idle between requests, and a
    body that follows its head later, are both fine."""
    with httpx.Client(base_url=slow_server.base_url, timeout=60) as http:
        assert http.get("/health").status_code == 200
        time.sleep(HEADER_TIMEOUT * 1.5)  # idle on the kept-alive connection (uvicorn: 5s)
        assert http.get("/health").status_code == 200
    body = b'{"model": "%s", "input": "Hi", "max_output_tokens": 4}' % MODEL_ID.encode()
    head = (
        b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", slow_server.port)) as sock:
        sock.sendall(head)
        time.sleep(HEADER_TIMEOUT * 1.5)
        sock.sendall(body)
        sock.settimeout(60)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def _trickle_head(path: str, kind: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\n"
        "Content-Length: 1000000\r\n\r\n"
    ).encode()


def test_trickled_bodies_are_answered_408_and_closed(slow_server: RespdServer) -> None:
    """Eight connections announce a 1 MB body and send a byte every half second: each is
    answered 408 and closed at the body deadline, with nothing logged as an error, while
    a complete request is served meanwhile."""
    targets = [
        ("/v1/responses", "application/json"),
        ("/v1/files", "multipart/form-data; boundary=b0undary"),
    ]
    socks = []
    for i in range(8):
        sock = socket.create_connection(("127.0.0.1", slow_server.port))
        path, kind = targets[i % 2]
        first = b"{" if i % 2 == 0 else b'--b0undary\r\nContent-Disposition: form-data; name="file"'
        sock.sendall(_trickle_head(path, kind) + first)
        sock.setblocking(False)
        socks.append(sock)
    opened = time.monotonic()
    answers = [b""] * len(socks)
    closed: list[float | None] = [None] * len(socks)
    try:
        with httpx.Client(base_url=slow_server.base_url, timeout=60) as http:
            assert http.get("/health").status_code == 200
        while None in closed and time.monotonic() - opened < BODY_TIMEOUT + 15:
            for i, sock in enumerate(socks):
                if closed[i] is not None:
                    continue
                try:
                    sock.send(b" ")
                    while chunk := sock.recv(4096):
                        answers[i] += chunk
                    closed[i] = time.monotonic() - opened  # EOF
                except BlockingIOError:
                    pass
                except (ConnectionResetError, BrokenPipeError):
                    closed[i] = time.monotonic() - opened
            time.sleep(0.5)
    finally:
        for sock in socks:
            sock.close()
    assert None not in closed, closed
    assert all(BODY_TIMEOUT * 0.8 <= t < BODY_TIMEOUT + 5 for t in closed if t), closed
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b'"request_timeout"' in answer
    time.sleep(0.5)
    log = slow_server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
