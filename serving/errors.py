"""The one error type of the serving core: a gRPC status code and a message saying what is wrong.
Both front ends (gRPC, REST) turn it into their own status."""
from __future__ import annotations

import grpc

# TF Serving's REST API maps canonical codes to these HTTP statuses (http_server.cc,
# ToHTTPStatusCode); any other code is 500.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


class ServingError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, http_status: int | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self._http_status = http_status

    @property
    def http_status(self) -> int:
        """TF Serving's status for the code, unless the error names its own."""
        return self._http_status or HTTP_STATUS.get(self.code, 500)


def invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def too_large(message: str) -> ServingError:
    """A request over a size limit: RESOURCE_EXHAUSTED, and over REST 413 rather than the 429 TF
    Serving's table gives the code (which it uses for a full batching queue)."""
    return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, message, http_status=413)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)
