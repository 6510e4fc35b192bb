"""Request counters and latency histograms in Prometheus' text format (served on the REST port)."""
from __future__ import annotations

import bisect
import threading
from collections import defaultdict

BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self, server_restarts: int = 0):
        # How many server processes died before this one and were replaced (serving.supervisor).
        self.server_restarts = server_restarts
        self._lock = threading.Lock()
        self._requests = defaultdict(int)  # (api, model, method, code) -> count
        self._buckets = defaultdict(lambda: [0] * (len(BUCKETS_S) + 1))  # (api, model, method) -> counts
        self._sums = defaultdict(float)
        self._warmup_requests = defaultdict(int)  # (model, version) -> warmup records replayed
        self._warmups = defaultdict(int)  # (model, status code) -> warmups run
        self._request_log = defaultdict(int)  # (model, outcome) -> count; outcome "written" or why dropped

    def observe_request_log(self, model: str, outcome: str, count: int = 1) -> None:
        """A request log record written ("written") or dropped ("queue_full", "write_error")."""
        with self._lock:
            self._request_log[(model, outcome)] += count

    def observe_warmup(self, model: str, version: int, requests: int, code: str, seconds: float) -> None:
        del seconds  # logged by the caller; the count is what alerting needs
        with self._lock:
            self._warmup_requests[(model, str(version))] += requests
            self._warmups[(model, code)] += 1

    def observe(self, api: str, model: str, method: str, code: str, seconds: float) -> None:
        key = (api, model, method)
        index = bisect.bisect_left(BUCKETS_S, seconds)
        with self._lock:
            self._requests[(*key, code)] += 1
            self._buckets[key][index] += 1
            self._sums[key] += seconds

    def render(self) -> str:
        out = ["# HELP loopline_requests_total Requests by API, model, method and status code.",
               "# TYPE loopline_requests_total counter"]
        with self._lock:
            for (api, model, method, code), n in sorted(self._requests.items()):
                out.append(f'loopline_requests_total{{api="{api}",model="{_q(model)}",method="{method}",code="{code}"}} {n}')
            out += ["# HELP loopline_request_errors_total Requests that did not end OK.",
                    "# TYPE loopline_request_errors_total counter"]
            errors = defaultdict(int)
            for (api, model, method, code), n in self._requests.items():
                if code != "OK":
                    errors[(api, model, method)] += n
            for (api, model, method), n in sorted(errors.items()):
                out.append(f'loopline_request_errors_total{{api="{api}",model="{_q(model)}",method="{method}"}} {n}')
            out += ["# HELP loopline_request_latency_seconds Request latency.",
                    "# TYPE loopline_request_latency_seconds histogram"]
            for (api, model, method), counts in sorted(self._buckets.items()):
                labels = f'api="{api}",model="{_q(model)}",method="{method}"'
                total = 0
                for bound, n in zip((*BUCKETS_S, "+Inf"), counts):
                    total += n
                    out.append(f'loopline_request_latency_seconds_bucket{{{labels},le="{bound}"}} {total}')
                out.append(f"loopline_request_latency_seconds_sum{{{labels}}} {self._sums[(api, model, method)]:.6f}")
                out.append(f"loopline_request_latency_seconds_count{{{labels}}} {total}")
            out += ["# HELP loopline_warmup_requests_total Warmup records replayed when a version loaded.",
                    "# TYPE loopline_warmup_requests_total counter"]
            for (model, version), n in sorted(self._warmup_requests.items()):
                out.append(f'loopline_warmup_requests_total{{model="{_q(model)}",version="{version}"}} {n}')
            out += ["# HELP loopline_warmups_total Version warmups by result (a failed one refuses the version).",
                    "# TYPE loopline_warmups_total counter"]
            for (model, code), n in sorted(self._warmups.items()):
                out.append(f'loopline_warmups_total{{model="{_q(model)}",code="{code}"}} {n}')
            out += _request_log_lines(self._request_log)
        out += ["# HELP loopline_server_restarts_total Times `loopline serve` started the server process again after "
                "it died (a crash in the model's code).",
                "# TYPE loopline_server_restarts_total counter",
                f"loopline_server_restarts_total {self.server_restarts}"]
        return "\n".join(out) + "\n"


def _request_log_lines(counts: dict) -> list[str]:
    out = ["# HELP loopline_request_log_records_total Sampled requests written to the request log.",
           "# TYPE loopline_request_log_records_total counter"]
    out += [f'loopline_request_log_records_total{{model="{_q(model)}"}} {n}'
            for (model, outcome), n in sorted(counts.items()) if outcome == "written"]
    out += ["# HELP loopline_request_log_dropped_total Sampled requests not logged (queue full, write failed); "
            "their answers went out as usual.",
            "# TYPE loopline_request_log_dropped_total counter"]
    out += [f'loopline_request_log_dropped_total{{model="{_q(model)}",reason="{outcome}"}} {n}'
            for (model, outcome), n in sorted(counts.items()) if outcome != "written"]
    return out


def _q(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")[:200]
