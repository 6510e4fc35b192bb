"""The REST server's HTTP limits (serving/http_limits.py, serving.limits.http_*), against real
servers on 127.0.0.1 over raw sockets: over-long and too many headers, an endless head, a slow
head, kept-alive connections, and the connection limit (in TF Serving's flags start mode)."""
from __future__ import annotations

import json
import select
import socket
import time

import pytest

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from tests.serving_helpers import ServerProcess, TfServingServer, add_version, export_model, tree_rss_bytes

STATUS = b"GET /v1/models/penguins HTTP/1.1\r\nHost: 127.0.0.1\r\n"
PREDICT_BODY = json.dumps({"signature_name": "predict_raw", "instances": [
    {"bill_length_mm": [40.0], "flipper_length_mm": [190.0], "island": ["Dream"]}]}).encode()
PREDICT = (b"POST /v1/models/penguins:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(PREDICT_BODY) + PREDICT_BODY)
HEAD_TIMEOUT_SECONDS, BODY_TIMEOUT_SECONDS, KEEP_ALIVE_SECONDS, MAX_REQUEST_BYTES = 1, 1, 3, 65536


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_model(tmp_path_factory.mktemp("export") / "penguins")


@pytest.fixture(scope="module")
def server(tmp_path_factory, exported):
    workspace = tmp_path_factory.mktemp("workspace")
    add_version(workspace / "serving" / "penguins", exported, 1)
    write_serving_configs(str(workspace / "serving"), ServingConfig())
    server = ServerProcess(workspace, f"serving.limits.http_header_timeout_seconds={HEAD_TIMEOUT_SECONDS}",
                           f"serving.limits.http_keep_alive_seconds={KEEP_ALIVE_SECONDS}",
                           f"serving.limits.http_body_timeout_seconds={BODY_TIMEOUT_SECONDS}",
                           f"serving.max_request_bytes={MAX_REQUEST_BYTES}")
    try:
        yield server
    finally:
        server.stop()


def connect(port: int, timeout: float = 15) -> socket.socket:
    """A connection to the REST port, retried while it is refused: the harness waits until gRPC
    answers (as TF Serving's does), and the REST listener starts a moment after. A refused
    connection never reaches the server, so no limit counts it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def read_answer(reader) -> tuple[int, bytes]:
    """One HTTP/1.1 answer from a socket's file: status and body."""
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline().strip()):
        name, value = line.decode().split(":", 1)
        if name.lower() == "content-length":
            length = int(value)
    return status, reader.read(length)


def refusal(sock: socket.socket, request: bytes) -> tuple[int, str, bytes]:
    """Sends `request`; the answer's status, its error message, and what came after it (b"": the
    server closed the connection)."""
    sock.sendall(request)
    with sock.makefile("rb") as reader:
        status, body = read_answer(reader)
        return status, json.loads(body)["error"], reader.read()


def test_ordinary_heads_are_answered_over_keep_alive(server):
    """Up to the limits nothing changes: 100 headers, a 16,000-byte header, then a predict, on one
    connection; and a connection idle past the head deadline (between requests) is still served."""
    many = STATUS + b"".join(b"X-Header-%d: value\r\n" % i for i in range(99)) + b"\r\n"
    long_line = STATUS + b"X-Long: " + b"a" * 16000 + b"\r\n\r\n"
    with connect(server.rest_port) as sock, sock.makefile("rb") as reader:
        for request in (many, long_line, PREDICT):
            sock.sendall(request)
            status, body = read_answer(reader)
            assert status == 200, body
        assert len(json.loads(body)["predictions"][0]["scores"]) == 3
        time.sleep(HEAD_TIMEOUT_SECONDS + 0.5)  # idle, not a request: the head deadline does not apply
        sock.sendall(STATUS + b"\r\n")
        assert read_answer(reader)[0] == 200


@pytest.mark.parametrize("request_head, status, option", [
    (STATUS + b"X-Big: " + b"a" * (17 * 1024) + b"\r\n\r\n", 431, "http_max_header_line_bytes"),
    (STATUS + b"".join(b"X-Part-%d: %s\r\n" % (i, b"b" * 700) for i in range(95)) + b"\r\n", 431,
     "http_max_header_bytes"),
    (STATUS + b"".join(b"X-Header-%d: value\r\n" % i for i in range(100)) + b"\r\n", 431, "http_max_headers"),
    (b"GET /v1/models/" + b"m" * (17 * 1024) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414,
     "http_max_header_line_bytes"),
    (b"POST /v1/models/penguins:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000000\r\n\r\n", 413,
     "serving.max_request_bytes"),
], ids=["17KB-header", "65KB-of-headers", "101-headers", "17KB-url", "content-length-over-limit"])
def test_an_over_limit_head_is_refused_and_the_connection_closed(server, request_head, status, option):
    """The 413 comes from the Content-Length alone: no body is sent, so a server that waited for
    it would not answer."""
    with connect(server.rest_port) as sock:
        code, message, after = refusal(sock, request_head)
    assert (code, after) == (status, b"")
    assert option in message
    with connect(server.rest_port) as sock, sock.makefile("rb") as reader:  # the server serves on
        sock.sendall(STATUS + b"\r\n")
        assert read_answer(reader)[0] == 200


def test_an_endless_head_is_refused_as_it_arrives(server):
    """50 MB of one header that never ends: answered 431 while the bytes stream in, and the server
    holds far less than what was sent."""
    before = tree_rss_bytes(server.proc.pid)
    chunk, sent = b"a" * 65536, 0
    with connect(server.rest_port) as sock:
        sock.sendall(STATUS + b"X-Endless: ")
        try:
            while sent < 50 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # the server closed after the linger: it stopped reading
            pass
        with sock.makefile("rb") as reader:
            status, body = read_answer(reader)
    grown = tree_rss_bytes(server.proc.pid) - before
    assert status == 431 and "http_max_header_bytes" in json.loads(body)["error"]
    assert grown < sent / 5, f"the server grew by {grown} bytes while {sent} were sent"


def test_a_slow_head_gets_408_after_the_head_deadline(server):
    """One byte every 0.3 s (a slowloris): kept-alive timing does not save it."""
    answer = b""
    with connect(server.rest_port) as sock:
        for byte in (STATUS + b"X-Slow: 1\r\n\r\n")[:40]:
            if select.select([sock], [], [], 0.3)[0]:
                answer = sock.recv(65536)
                break
            sock.sendall(bytes([byte]))
        while (more := sock.recv(65536)):
            answer += more
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"http_header_timeout_seconds" in answer


def test_a_stalled_body_is_closed_after_the_body_timeout_and_a_slow_one_is_read(server):
    """A Content-Length the client never sends in full (the fuzzer's connection that stayed open)."""
    head, body = PREDICT[:PREDICT.index(b"\r\n\r\n") + 4], PREDICT[PREDICT.index(b"\r\n\r\n") + 4:]
    with connect(server.rest_port, timeout=BODY_TIMEOUT_SECONDS * 10) as sock:
        sock.sendall(head + body[:5])
        answer = b""
        while (more := sock.recv(65536)):
            answer += more
    assert answer.startswith(b"HTTP/1.1 408 ") and b"http_body_timeout_seconds" in answer, answer
    # A body whose bytes keep coming, each within the timeout, is read and answered.
    with connect(server.rest_port) as sock, sock.makefile("rb") as reader:
        sock.sendall(head)
        for start in range(0, len(body), max(1, len(body) // 3)):
            time.sleep(BODY_TIMEOUT_SECONDS * 0.6)
            sock.sendall(body[start:start + max(1, len(body) // 3)])
        assert read_answer(reader)[0] == 200


def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive(server):
    with connect(server.rest_port, timeout=KEEP_ALIVE_SECONDS * 5) as sock, sock.makefile("rb") as reader:
        sock.sendall(STATUS + b"\r\n")
        assert read_answer(reader)[0] == 200
        assert reader.read() == b""  # the server closed it (a 30 s keep-alive would time this read out)


def test_connections_over_the_limit_are_closed_in_tf_serving_flags_mode(tmp_path, exported):
    """--set limits apply with TF Serving's flags too. Beyond 2 connections a new one is answered
    503 and closed; the first two still get answers, and once one closes a new one is served."""
    add_version(tmp_path / "penguins", exported, 1)
    server = TfServingServer(tmp_path, "--set", "serving.limits.http_max_connections=2", model_name="penguins",
                             model_path=tmp_path / "penguins")
    try:
        first, second = connect(server.rest_port), connect(server.rest_port)
        readers = [first.makefile("rb"), second.makefile("rb")]
        for sock, reader in zip((first, second), readers):
            sock.sendall(STATUS + b"\r\n")
            assert read_answer(reader)[0] == 200
        with connect(server.rest_port) as third, third.makefile("rb") as reader:
            status, body = read_answer(reader)
            assert status == 503 and "http_max_connections" in json.loads(body)["error"]
            assert reader.read() == b""
        for sock, reader in zip((first, second), readers):
            sock.sendall(STATUS + b"\r\n")
            assert read_answer(reader)[0] == 200
        readers[0].close()
        first.close()
        assert _served_within(server.rest_port, tries=50)
        readers[1].close()
        second.close()
    finally:
        server.stop()


def _served_within(port: int, tries: int) -> bool:
    """Whether a new connection gets a 200 within `tries` attempts (the server sees a close a moment
    after the client makes it)."""
    for _ in range(tries):
        with connect(port) as sock, sock.makefile("rb") as reader:
            try:
                sock.sendall(STATUS + b"\r\n")
                if read_answer(reader)[0] == 200:
                    return True
            except (OSError, IndexError):  # refused: closed before or after its 503
                pass
        time.sleep(0.1)
    return False
