"""Incomplete requests are closed within a bounded time (server/protocol.py): a connection holding
half its headers, one sending them a byte at a time, and one whose body stops short of its
Content-Length. A server with half-second deadlines over the shared model (its engine is not
started or stopped: lifespan off; none of these requests reaches it)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from server_harness import API_KEY

pytestmark = pytest.mark.model

DEADLINE = 0.5


@pytest.fixture(scope="module")
def quick(srv):
    import uvicorn

    from railcall.server.app import create_app
    from railcall.server.protocol import uvicorn_config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(srv.served, engine=srv.engine, api_key=API_KEY)
    server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                           header_timeout=DEADLINE, body_timeout=DEADLINE))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def closed_after(port: int, pieces: list[bytes], every: float = 0.0, limit: float = 5.0) -> float:
    """Send `pieces` (`every` seconds apart) and return the seconds until the server closed."""
    with socket.create_connection(("127.0.0.1", port)) as c:
        t0 = time.monotonic()
        c.settimeout(limit)
        for piece in pieces:
            try:
                c.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):  # closed while the client was still sending
                return time.monotonic() - t0
            time.sleep(every)
        try:
            while c.recv(4096):
                pass
        except (TimeoutError, socket.timeout):
            pytest.fail(f"the connection was still open after {limit} s")
        except ConnectionResetError:
            pass
        return time.monotonic() - t0


def test_partial_headers_are_closed(quick):
    assert closed_after(quick, [b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"]) < DEADLINE + 1.0


def test_headers_a_byte_at_a_time_are_closed_at_the_deadline(quick):
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40
    # a byte every 0.1 s would keep an idle timeout from ever firing; the deadline is from the start
    assert closed_after(quick, [head[i:i + 1] for i in range(len(head))], every=0.1, limit=8) < 4.5


def test_a_body_shorter_than_its_content_length_is_closed(quick):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n")
    assert closed_after(quick, [head, b'{"model": "smol']) < DEADLINE + 1.0


def test_whole_requests_and_kept_alive_connections_still_work(quick):
    with httpx.Client(base_url=f"http://127.0.0.1:{quick}") as c:
        assert c.get("/health").status_code == 200
        time.sleep(DEADLINE * 1.5)  # idle between requests: keep-alive's 5 s, not the head's deadline
        assert c.get("/health").status_code == 200


def test_the_served_app_runs_with_the_deadlines(srv):
    from railcall.server.protocol import BODY_TIMEOUT, HEADER_TIMEOUT, GuardedH11Protocol

    http = srv.server.config.http
    assert issubclass(http, GuardedH11Protocol) and (http.header_timeout, http.body_timeout) == (HEADER_TIMEOUT,
                                                                                                 BODY_TIMEOUT)
