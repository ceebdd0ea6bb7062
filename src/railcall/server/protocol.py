"""The HTTP connection: uvicorn's h11 protocol with a deadline on reading each request.

uvicorn bounds the wait between requests on a kept-alive connection (`timeout_keep_alive`) and
the size of an unfinished request head (h11's `max_incomplete_event_size`, 16 KiB), but not the
time a client may take to send one: a connection holding half its headers, or a body shorter
than its Content-Length, stayed open for as long as the client kept it (each one a socket and,
for the body, a request coroutine waiting in `_read_body`). `GuardedH11Protocol` adds two
deadlines, each a timer of the event loop (nothing runs per byte):

    connection opened, or the previous response sent  --headers: HEADER_TIMEOUT-->  head complete
    head complete                                     --body:    BODY_TIMEOUT  -->  body complete

Past either, the connection is closed (one log line); a request whose body was cut short this
way ends as a client that went away (app._read_body). Built per connection by uvicorn; the
deadlines come from `uvicorn_config`.
"""

from __future__ import annotations

import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("railcall.server")

HEADER_TIMEOUT = 10.0  # seconds for a request's head: a client sends it at once (curl: < 1 ms)
BODY_TIMEOUT = 60.0  # seconds for its body: the 4 MiB --max-body limit at ~0.5 Mbit/s
KEEP_ALIVE = 5  # seconds an idle kept-alive connection waits for its next request (uvicorn's default)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head and on its body."""

    header_timeout = HEADER_TIMEOUT
    body_timeout = BODY_TIMEOUT

    def connection_made(self, transport) -> None:
        self._deadline = None
        self._phase = ""
        super().connection_made(transport)
        self._arm("head", self.header_timeout)

    def handle_events(self) -> None:
        super().handle_events()
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._phase != "body":
                self._arm("body", self.body_timeout)
        elif state is not h11.IDLE:  # the request was read whole (or the connection is over)
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm("head", self.header_timeout)  # the next request's; a pipelined one disarms it at once
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._expired, phase, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, ""

    def _expired(self, phase: str, seconds: float) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if phase == "body" or self.conn.their_state is not h11.IDLE or self.conn.trailing_data[0]:
            client = "%s:%d" % self.client if self.client else "a client"
            log.info("closed the connection of %s: its request %s was not complete after %g s", client,
                     "body" if phase == "body" else "head", seconds)
        self.transport.close()


def uvicorn_config(app, *, host: str, port: int, log_level: str, header_timeout: float = HEADER_TIMEOUT,
                   body_timeout: float = BODY_TIMEOUT, **kw):
    """The uvicorn.Config railcall serves with: the guarded h11 protocol and its deadlines."""
    import uvicorn

    protocol = type("GuardedH11Protocol", (GuardedH11Protocol,),
                    {"header_timeout": header_timeout, "body_timeout": body_timeout})
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=protocol,
                          timeout_keep_alive=KEEP_ALIVE, **kw)
