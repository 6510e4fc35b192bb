"""The REST server's HTTP limits (serving.limits.http_*), enforced while a request's head arrives.

uvicorn's httptools protocol buffers a request head without bound: the parser keeps a header's
pieces until the header ends, however long it is. The protocol here counts a head's bytes before
the parser sees them and hands it no more than http_max_header_bytes, then answers:

  431  a header line, the whole head or the header count over its limit
  414  a URL over the line limit (checked once the head is complete)
  413  a Content-Length over serving.max_request_bytes (before any of the body is read)
  408  a head not finished within http_header_timeout_seconds of its first byte, or a body with no
       byte for http_body_timeout_seconds
  503  a connection beyond http_max_connections (closed at once)

Each answer is `{"error": ...}` naming the limit and its option, and the connection closes. The
counting is a few integer operations per read and per header: nothing runs per byte in Python.
"""
from __future__ import annotations

from http import HTTPStatus

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving import json_codec
from serving.config import LimitsConfig

# After a refusal the client may still be sending (a body, the rest of an endless head). Closing
# with unread bytes makes the kernel reset the connection, which can discard the answer before the
# client reads it; so what arrives is read and dropped until the client closes, at most this long.
LINGER_SECONDS = 5.0


class _Refused(Exception):
    """Raised from a parser callback to stop the parser once the refusal is answered."""


def limited_protocol(limits: LimitsConfig, max_body_bytes: int) -> type[LimitedHttpProtocol]:
    """The protocol class uvicorn builds for each connection, with one server's limits."""
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), {"limits": limits, "max_body_bytes": max_body_bytes})


def _answer(status: int, message: str, default_headers) -> bytes:
    body = json_codec.dumps({"error": message})
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
    lines += [name + b": " + value + b"\r\n" for name, value in default_headers]
    lines.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
    return b"".join(lines) + body


class LimitedHttpProtocol(HttpToolsProtocol):
    limits = LimitsConfig()
    max_body_bytes = 16 * 1024 * 1024

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        limits = self.limits
        self.max_line = limits.http_max_header_line_bytes
        self.max_head = limits.http_max_header_bytes
        self.max_headers = limits.http_max_headers
        self.head_room = self.max_head  # bytes the head being read may still take
        self.in_body = False  # between a head's end and its message's end: bytes are not head bytes
        self.head_timer = None
        self.body_timer = None  # armed only while a body spans reads (most come whole with their head)
        self.refused = False  # answered and closing: nothing more is parsed

    # The connection

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.http_max_connections:
            self.refused = True
            message = (f"too many connections: the server holds at most {self.limits.http_max_connections} "
                       "(serving.limits.http_max_connections); retry later")
            transport.write(_answer(503, message, self.server_state.default_headers))
            transport.close()
            return
        # A connection that never sends a byte is closed as an idle kept-alive one is.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # lingering after the answer: dropped unread
        self._unset_keepalive_if_required()
        while not self.in_body and len(data) > self.head_room:
            # The head reaches its limit within these bytes: the parser gets only what fits.
            fits, data = data[:self.head_room], data[self.head_room:]
            self.head_room = 0
            self._feed(fits)
            if self.refused:
                return
            if self.head_room == 0:  # no head ended within the limit (its end resets the room)
                return self._refuse(431, f"the request head is over {self.max_head} bytes "
                                         "(serving.limits.http_max_header_bytes)")
        if not self.in_body:
            self.head_room -= len(data)
        self._feed(data)
        if self.refused:
            return
        if self.in_body:  # a body still to come: no byte for its timeout, and it is refused
            self._cancel_body_timer()
            self.body_timer = self.loop.call_later(self.limits.http_body_timeout_seconds, self._body_timed_out)
        # A head begun and not finished: its deadline runs from this read, the one its first byte came in.
        elif self.head_room < self.max_head and self.head_timer is None:
            self.head_timer = self.loop.call_later(self.limits.http_header_timeout_seconds, self._head_timed_out)

    def _feed(self, data: bytes) -> None:
        """The parser's run over `data`; a malformed request is answered as uvicorn answers it."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if not self.refused:  # else a limit's callback stopped the parser and has answered
                self.refused = True
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    # The parser's callbacks. They call uvicorn's by name: super() costs more than the checks.

    def on_header(self, name: bytes, value: bytes) -> None:
        HttpToolsProtocol.on_header(self, name, value)
        if len(name) + len(value) > self.max_line:
            self._stop(431, f"header {name[:64].decode('latin-1')!r} is over {self.max_line} bytes "
                            "(serving.limits.http_max_header_line_bytes)")
        if len(self.headers) > self.max_headers:
            self._stop(431, f"the request has over {self.max_headers} headers (serving.limits.http_max_headers)")
        if self.headers[-1][0] == b"content-length" and int(value) > self.max_body_bytes:
            self._stop(413, f"request body of {int(value)} bytes is over the limit of {self.max_body_bytes} bytes "
                            "(serving.max_request_bytes)")

    def on_headers_complete(self) -> None:
        # The URL is checked here, whole: while it arrives, the head's byte count bounds it.
        if len(self.url) > self.max_line:
            self._stop(414, f"the request's URL is over {self.max_line} bytes "
                            "(serving.limits.http_max_header_line_bytes)")
        self.in_body = True
        self.head_room = self.max_head
        if self.head_timer is not None:  # tested here: most heads come in one read and never start one
            self._cancel_head_timer()
        HttpToolsProtocol.on_headers_complete(self)

    def on_message_complete(self) -> None:
        self.in_body = False
        if self.body_timer is not None:
            self._cancel_body_timer()
        HttpToolsProtocol.on_message_complete(self)

    # Refusals

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if not self.refused and not self.transport.is_closing():
            self._refuse(408, f"the request head was not complete within {self.limits.http_header_timeout_seconds:g} s "
                              "of its first byte (serving.limits.http_header_timeout_seconds)")

    def _body_timed_out(self) -> None:
        self.body_timer = None
        if not self.refused and not self.transport.is_closing():
            self._refuse(408, f"the request body sent nothing for {self.limits.http_body_timeout_seconds:g} s "
                              "(serving.limits.http_body_timeout_seconds)")

    def _stop(self, status: int, message: str):
        self._refuse(status, message)
        raise _Refused(message)

    def _refuse(self, status: int, message: str) -> None:
        """Answers `status` and closes; what the client still sends is dropped until it closes."""
        self.refused = True
        self._cancel_head_timer()
        self._cancel_body_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            if self.cycle.response_started:
                self.transport.close()  # an earlier request's answer is under way: no answer can go in between
                return
            # The request being read (a stalled body): its application sees a disconnect, and the
            # answer is this one.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(_answer(status, message, self.server_state.default_headers))
        self.transport.write_eof()
        self.flow.resume_reading()  # keep reading (and dropping) so that the close is not a reset
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _cancel_body_timer(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
