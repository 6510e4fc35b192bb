"""The serving fuzzer's harness: a real `loopline serve` to aim at, the senders (the stock
tensorflow_serving.apis stubs, raw gRPC bytes, kept-alive HTTP, raw sockets), the oracle every case
is judged by, and the report `make fuzz` writes. The cases are in tests/fuzz_serving_cases.py.

The oracle, after every case: the server process is alive; a gRPC answer is OK or a code for a
client's mistake (ALLOWED_CODES), an HTTP answer 2xx or 4xx; a raw HTTP exchange may end in a
closed connection but must not hang; an error answer says what is wrong (a message, a body); the
server's resident memory stays within RSS_MARGIN_BYTES of what it held once warmed up; every
PROBE_EVERY cases a valid request still gets its answer. A case that kills the server (or grows
it past the bound) restarts it, so the search goes on and shrinks.
"""
from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import text_format
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from tests.fuzz_serving_cases import MAX_BODY_BYTES, MODEL, valid_predict
from tests.serving_helpers import ServerProcess, add_version, child_pids, export_model, listening_sockets, running

EXAMPLES_VARIABLE = "LOOPLINE_FUZZ_EXAMPLES"  # cases per target; unset: each test's CI budget
REPORT_VARIABLE = "LOOPLINE_FUZZ_REPORT"  # where `make fuzz` writes the JSON report (and .md beside it)

C = grpc.StatusCode
ALLOWED_CODES = frozenset({C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND, C.FAILED_PRECONDITION, C.RESOURCE_EXHAUSTED,
                           C.UNIMPLEMENTED, C.OUT_OF_RANGE, C.UNAUTHENTICATED, C.PERMISSION_DENIED, C.CANCELLED,
                           C.DEADLINE_EXCEEDED})
RSS_MARGIN_BYTES = 500 * 2**20
PROBE_EVERY = 50
CALL_SECONDS = 30.0  # a gRPC call or REST request's answer
CLOSE_SECONDS = 5.0  # a half-closed connection's end
HEADER_TIMEOUT_SECONDS = 1.0  # serving.limits.http_header_timeout_seconds of the fuzzed server
# The server's own options: a short head deadline, so unfinished heads are judged quickly.
SERVER_OVERRIDES = (f"serving.limits.http_header_timeout_seconds={HEADER_TIMEOUT_SECONDS}",)
# A shrink replays the failing case again and again, each crash a restart: long runs only.
LONG_RUN = EXAMPLES_VARIABLE in os.environ
PHASES = tuple(Phase) if LONG_RUN else (Phase.explicit, Phase.reuse, Phase.generate)
# Cases are big and slow on purpose (rank 300 shapes, 16 MiB bodies, a server call each).
SLOW_CASES = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
              HealthCheck.filter_too_much]


def examples(ci_budget: int) -> int:
    """Cases per target: LOOPLINE_FUZZ_EXAMPLES in a long run, else the CI budget."""
    return int(os.environ.get(EXAMPLES_VARIABLE, ci_budget))


# -- what went wrong -------------------------------------------------------------------------------
class CaseFailed(AssertionError):
    """A case broke the oracle; each kind its own class, so hypothesis shrinks each separately."""


class ServerDied(CaseFailed):
    pass


class ForbiddenAnswer(CaseFailed):
    pass


class ConnectionHung(CaseFailed):
    pass


class MemoryGrew(CaseFailed):
    pass


class StoppedServing(CaseFailed):
    pass


class SilentError(CaseFailed):
    """An error answer that does not say what is wrong."""


@dataclass
class Answer:
    """What a case got back: a label for the report (a gRPC code name, `HTTP 400`, `closed`), the
    failure it shows (None: allowed) and its details."""
    label: str
    failure: type[CaseFailed] | None = None
    details: str = ""


# -- the server ------------------------------------------------------------------------------------
def prepare_workspace(workspace: Path) -> Path:
    """A serving root with the test model as version 1 of MODEL."""
    source = export_model(workspace / "export")
    add_version(workspace / "serving" / MODEL, source, 1)
    write_serving_configs(str(workspace / "serving"), ServingConfig(model_name=MODEL))
    return workspace


class FuzzServer:
    """`loopline serve` on the workspace's model, started again after a case kills it."""

    def __init__(self, workspace: Path, overrides: tuple[str, ...] = (), valid_request=valid_predict):
        self.workspace = workspace
        self.overrides = overrides  # serving keys beyond SERVER_OVERRIDES
        self.valid_request = valid_request  # what the server must still answer between cases
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self.process = ServerProcess(self.workspace, *SERVER_OVERRIDES, *self.overrides)
        unlimited = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        self.channel = grpc.insecure_channel(self.process.grpc_target, options=unlimited)
        self.prediction = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self._raw: dict[str, object] = {}
        self._http: http.client.HTTPConnection | None = None
        self.prediction.Predict(self.valid_request(), timeout=CALL_SECONDS)  # warm: the memory bound starts here
        self.pid = self._serving_pid()
        self.start_rss = self.rss()

    def _serving_pid(self) -> int:
        """The process holding the gRPC port's listening socket: `loopline serve` itself or, when it
        supervises (serving.supervise), its child, which a crash would replace unseen."""
        top = self.process.proc.pid
        sockets = listening_sockets(self.process.grpc_port)
        for pid in [top, *child_pids(top)]:
            try:
                if any(os.readlink(fd) in sockets for fd in Path(f"/proc/{pid}/fd").iterdir()):
                    return pid
            except OSError:
                continue
        return top

    def alive(self, wait: float = 0.0) -> bool:
        """Whether the serving process still runs; `wait`: seconds a dying one gets to be seen gone."""
        deadline = time.monotonic() + wait
        while self.process.proc.poll() is None and running(self.pid):
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.05)
        return False

    def rss(self) -> int:
        """The server's resident memory in bytes (VmRSS), 0 once it is gone."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        return int(found[1]) * 1024 if found else 0

    def how_it_ended(self) -> str:
        if self.pid != self.process.proc.pid:
            ending = f"its serving process {self.pid} ended, under a supervisor"
        else:
            try:
                code = self.process.proc.wait(5)
                ending = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            except subprocess.TimeoutExpired:
                ending = "not answering"
        return f"{ending}; its last words: {self.process.log()[-1500:]}"

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self._start()

    def stop(self) -> None:
        self.channel.close()
        if self._http is not None:
            self._http.close()
        self.process.stop()

    # -- senders --------------------------------------------------------------------------------
    def grpc(self, method: str, request: Message, compress: bool = False) -> Answer:
        stub = self.models if method == "GetModelStatus" else self.prediction
        compression = grpc.Compression.Gzip if compress else None
        try:
            getattr(stub, method)(request, timeout=CALL_SECONDS, compression=compression)
        except grpc.RpcError as error:
            return _grpc_answer(error)
        return Answer("OK")

    def grpc_bytes(self, method_path: str, payload: bytes) -> Answer:
        """Bytes sent as they are (no serializer), so malformed protobuf reaches the server."""
        call = self._raw.get(method_path) or self._raw.setdefault(method_path, self.channel.unary_unary(method_path))
        try:
            call(payload, timeout=CALL_SECONDS)
        except grpc.RpcError as error:
            return _grpc_answer(error)
        return Answer("OK")

    def http(self, method: str, path: str, body: bytes) -> Answer:
        """One request on the kept-alive connection, sent again on a new connection when the server
        had closed that one."""
        for _ in range(2):
            try:
                return self._http_request(method, path, body)
            except (OSError, http.client.HTTPException) as exc:
                self._drop_http()
                error = exc
                if not isinstance(exc, ConnectionError):
                    break
        # A body over the limit may be refused before it is all sent; other requests deserve an answer.
        failure = None if len(body) > MAX_BODY_BYTES else ForbiddenAnswer
        return Answer("no answer", failure, f"{type(error).__name__}: {error}")

    def _http_request(self, method: str, path: str, body: bytes) -> Answer:
        if self._http is None:
            self._http = http.client.HTTPConnection("127.0.0.1", self.process.rest_port, timeout=CALL_SECONDS)
        self._http.request(method, path, body=body or None, headers={"Content-Type": "application/json"})
        response = self._http.getresponse()
        text = response.read()
        if response.will_close:
            self._drop_http()
        return Answer(f"HTTP {response.status}", _http_failure(response.status, text, method),
                      text[:500].decode("utf-8", "replace"))

    def _drop_http(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def http_exchange(self, data: bytes, then: str) -> Answer:
        """Raw bytes on a new connection; then the client closes, or half-closes and reads every
        answer until the server closes its side (which it must do within CLOSE_SECONDS)."""
        with socket.create_connection(("127.0.0.1", self.process.rest_port), timeout=CLOSE_SECONDS) as sock:
            try:
                sock.sendall(data)
                if then == "close":
                    return Answer("closed by the client")
                sock.shutdown(socket.SHUT_WR)
            except OSError:  # the server refused the bytes and closed first: allowed
                return Answer("closed by the server while sending")
            received, ended = _read_until_closed(sock, CLOSE_SECONDS)
        return _http_answer(received, ended, f"not closed {CLOSE_SECONDS} s after the client's end of input")

    def unfinished_head(self, head: bytes) -> Answer:
        """A head that never ends, the connection kept open: the server must answer 408 or close
        once its head deadline has passed."""
        wait = HEADER_TIMEOUT_SECONDS + 4
        with socket.create_connection(("127.0.0.1", self.process.rest_port), timeout=wait) as sock:
            try:
                sock.sendall(head)
            except OSError:
                return Answer("closed by the server while sending")
            received, ended = _read_until_closed(sock, wait)
        return _http_answer(received, ended or b" 408 " in received.split(b"\r\n", 1)[0],
                            f"no answer and not closed {wait} s after an unfinished head "
                            f"(serving.limits.http_header_timeout_seconds={HEADER_TIMEOUT_SECONDS})")


def _grpc_answer(error: grpc.RpcError) -> Answer:
    code, details = error.code(), error.details() or ""
    if code not in ALLOWED_CODES:
        return Answer(code.name, ForbiddenAnswer, details)
    return Answer(code.name, None if details.strip() else SilentError, details)


def _http_failure(status: int, body: bytes, method: str) -> type[CaseFailed] | None:
    if status >= 500:
        return ForbiddenAnswer
    if status >= 400 and method != "HEAD" and not body.strip():  # HEAD answers carry no body
        return SilentError
    return None


def _read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (True) or `seconds` pass (False)."""
    chunks, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except OSError:  # reset by the server: closed
            return b"".join(chunks), True
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
    return b"".join(chunks), False


def http_statuses(data: bytes) -> list[int]:
    """The status of each HTTP/1.x answer in `data`, read answer by answer (bodies by their
    Content-Length, so a body that quotes a status line is not taken for one)."""
    statuses, at = [], 0
    while (line := re.match(rb"HTTP/1\.[01] (\d{3})[^\r\n]*\r\n", data[at:])):
        status = int(line[1])
        statuses.append(status)
        head_end = data.find(b"\r\n\r\n", at)
        if head_end < 0:
            break
        length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", data[at:head_end])
        at = head_end + 4 + (int(length[1]) if length and status >= 200 else 0)
    return statuses


def _http_answer(received: bytes, ended: bool, hung: str) -> Answer:
    statuses = http_statuses(received)
    label = "HTTP " + ",".join(map(str, statuses)) if statuses else "closed"
    if any(s >= 500 for s in statuses):
        return Answer(label, ForbiddenAnswer, received[:500].decode("latin-1"))
    if not ended and not statuses:
        return Answer("hung", ConnectionHung, hung)
    return Answer(label)


# -- the oracle ------------------------------------------------------------------------------------
def describe(case) -> str:
    """A case as a report shows it: protos in text format, bytes and the rest by repr; long ones cut."""
    if isinstance(case, tuple):
        return "(" + ", ".join(describe(part) for part in case) + ")"
    text = text_format.MessageToString(case, as_one_line=True) if isinstance(case, Message) else repr(case)
    text = re.sub(r"(dim \{[^{}]*\} )\1{2,}", lambda m: f"<{m[0].count('dim')} x {m[1].strip()}> ", text)
    text = re.sub(r"(.)\1{15,}", lambda m: f"<{len(m[0])} x {m[1]}>", text)
    return text if len(text) <= 1500 else text[:1500] + f"... ({len(text)} characters)"


@dataclass
class TargetStats:
    cases: int = 0
    seconds: float = 0.0
    outcomes: Counter = field(default_factory=Counter)


class Oracle:
    """Sends each case through the server and judges it; keeps what the report needs."""

    def __init__(self, server: FuzzServer):
        self.server = server
        self.targets: dict[str, TargetStats] = {}
        self.failures: dict[tuple[str, str], dict] = {}  # (target, kind): the latest case (the shrunk one)
        self.peak_rss = server.rss()
        self.started = time.monotonic()

    def check(self, target: str, case, send) -> Answer:
        """Runs `send()` (which returns an Answer) for `case` and judges it; raises CaseFailed."""
        stats = self.targets.setdefault(target, TargetStats())
        began = time.perf_counter()
        try:
            answer = send()
        except OSError as exc:  # the server's port did not take a connection
            answer = Answer("connection refused", ForbiddenAnswer, f"{type(exc).__name__}: {exc}")
        stats.seconds += time.perf_counter() - began
        stats.cases += 1
        stats.outcomes[answer.label] += 1
        if not self.server.alive(wait=1.0 if answer.failure else 0.0):
            self._fail(ServerDied, target, case, f"the server died ({self.server.how_it_ended()})", restart=True)
        if answer.failure is not None:
            self._fail(answer.failure, target, case, f"{answer.label}: {answer.details}")
        rss = self.server.rss()
        self.peak_rss = max(self.peak_rss, rss)
        if rss > self.server.start_rss + RSS_MARGIN_BYTES:
            self._fail(MemoryGrew, target, case, f"the server holds {rss >> 20} MiB, "
                       f"{(rss - self.server.start_rss) >> 20} MiB more than at its start", restart=True)
        if stats.cases % PROBE_EVERY == 0:
            self.probe(target, case)
        return answer

    def probe(self, target: str, case=None) -> None:
        """A valid request must still be answered (a server may live on and serve nothing)."""
        try:
            answer = self.server.grpc("Predict", self.server.valid_request())
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the finding
            answer = Answer(type(exc).__name__, details=str(exc))
        if answer.label != "OK":
            self._fail(StoppedServing, target, case, f"a valid Predict got {answer.label}: {answer.details}",
                       restart=True)

    def _fail(self, kind: type[CaseFailed], target: str, case, message: str, restart: bool = False) -> None:
        key = (target, kind.__name__)
        count = self.failures.get(key, {}).get("count", 0) + 1
        self.failures[key] = {"target": target, "kind": kind.__name__, "message": message[:2000],
                              "example": describe(case), "count": count}
        if restart:
            self.server.restart()
        raise kind(f"{target}: {message}\ncase: {describe(case)}")

    def summary(self) -> dict:
        """The report's figures: cases and seconds per target, failures with their last (shrunk)
        case, the server's memory and restarts."""
        return {
            "seconds": round(time.monotonic() - self.started, 1),
            "cases": sum(s.cases for s in self.targets.values()),
            "targets": {name: {"cases": s.cases, "seconds": round(s.seconds, 1),
                               "outcomes": sorted(s.outcomes.items(), key=lambda kv: -kv[1])}
                        for name, s in sorted(self.targets.items())},
            "server": {"start_rss_mb": self.server.start_rss >> 20, "peak_rss_mb": self.peak_rss >> 20,
                       "restarts": self.server.restarts},
            "failures": list(self.failures.values()),
        }


# -- the report ------------------------------------------------------------------------------------
def write_report(oracle: Oracle, json_path: Path) -> None:
    """Adds this run to `json_path` (a bench/results file: its runs kept) and writes the run's
    Markdown summary beside it (same name, .md)."""
    from bench.__main__ import REPO, append_run, machine
    from tracking.system_info import git_commit

    run = {"examples_per_target": examples(0) or "CI budget", **oracle.summary(), "commit": git_commit(str(REPO)),
           "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    count = append_run(json_path, run)
    json_path.with_suffix(".md").write_text(markdown(run, count))


def markdown(run: dict, number: int) -> str:
    lines = [f"# Serving fuzz report (run {number})", "",
             f"{run['cases']} cases in {run['seconds']} s, up to {run['examples_per_target']} per target; "
             f"commit {run['commit']}, {run['date']} UTC. Server memory: {run['server']['start_rss_mb']} MiB at "
             f"start, peak {run['server']['peak_rss_mb']} MiB; {run['server']['restarts']} restarts.", "",
             "| target | cases | seconds | answers (most common first) |", "|---|---|---|---|"]
    for name, stats in run["targets"].items():
        answers = ", ".join(f"{label} {count}" for label, count in stats["outcomes"][:6])
        lines.append(f"| {name} | {stats['cases']} | {stats['seconds']} | {answers} |")
    lines += ["", f"## Failures ({len(run['failures'])})", ""]
    for failure in run["failures"]:
        lines += [f"- **{failure['target']}: {failure['kind']}** ({failure['count']} cases): {failure['message'][:300]}",
                  f"  minimal case: `{failure['example'][:600]}`"]
    if not run["failures"]:
        lines.append("None.")
    return "\n".join(lines) + "\n"

