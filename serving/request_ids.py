"""Request ids: the server accepts one from the client (HTTP header / gRPC metadata key
`x-request-id`, as proxies such as Envoy and nginx set it) or makes one, returns it (an HTTP
response header; gRPC trailing metadata), and the request log keeps it beside each record, so
labels that arrive later can be joined to what the model saw and answered."""
from __future__ import annotations

import contextvars
import re
import secrets

from serving.errors import invalid

HEADER = "x-request-id"  # lower case: gRPC metadata keys must be
MAX_LENGTH = 128
_VALID = re.compile(rf"[\x21-\x7e]{{1,{MAX_LENGTH}}}")  # printable ASCII, no spaces

# The id of the request the current thread answers: set by a front end before it calls the API
# code, read by the request log after the answer (TF Serving passes its LogMetadata the same way).
CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("loopline_request_id", default="")


def new_id() -> str:
    """128 random bits in 32 hex digits (uuid4().hex's form; a third of its cost per request)."""
    return secrets.token_hex(16)


def is_valid(request_id: str) -> bool:
    return _VALID.fullmatch(request_id) is not None


def begin(given: str | bytes | None) -> str:
    """The request's id (the client's, checked; else a new one), made CURRENT. A malformed id is
    INVALID_ARGUMENT naming the header: a silently replaced id would never join its labels."""
    if not given:
        request_id = new_id()
    else:
        request_id = given.decode("latin-1") if isinstance(given, bytes) else given
        if not is_valid(request_id):
            raise invalid(f"{HEADER}: expected 1 to {MAX_LENGTH} printable ASCII characters without spaces, "
                          f"got {request_id[:MAX_LENGTH + 8]!r}")
    CURRENT.set(request_id)
    return request_id


def from_grpc(context) -> str:
    """begin() with the id in a gRPC call's metadata."""
    for key, value in context.invocation_metadata() or ():
        if key == HEADER:
            return begin(value)
    return begin(None)


def from_asgi(headers) -> str:
    """An ASGI request's id ([(name, value)] in bytes, names lower case), or a new one; not yet
    checked: begin() checks it where the request is answered."""
    for key, value in headers:
        if key == b"x-request-id":
            return value.decode("latin-1")
    return new_id()


def answer_header(request_id: str) -> list[tuple[bytes, bytes]]:
    """The answer's `x-request-id` header (none for an id that was refused)."""
    return [(HEADER.encode(), request_id.encode())] if is_valid(request_id) else []
