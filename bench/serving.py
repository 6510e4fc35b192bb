"""Serving benchmark: the embedded server over gRPC and over REST vs `mlflow models serve` on the
registered model (REST) vs an in-process SavedModel call (the floor), on the same model, batch 1,
at 1 and 16 concurrent clients. Figures come from one run, side by side; the clients share the
machine with the servers. Two more points split the overhead: a gRPC server that runs no model
(transport alone) and the server's own Session call of the model in process. REST clients keep
their connections alive (one requests.Session per client thread), as Java and Go clients do.
Every run's headline figures are appended to `runs` in the JSON, so noise shows. The same run
states request logging's cost (the server at sampling rates 0, 0.1 and 1.0, interleaved) and
`loopline infer`'s examples/s on the server's core against the gRPC server's at 16 clients.

    python -m bench --only serving
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import portpicker

REPO = Path(__file__).resolve().parent.parent
SECONDS = float(os.environ.get("LOOPLINE_BENCH_SERVING_SECONDS", "6"))
CONCURRENCY = (1, 16)
ROW = {"bill_length_mm": 40.0, "flipper_length_mm": 190.0, "island": "Dream"}


def export_model(path: Path) -> Path:
    import keras

    from trainer.export import export_saved_model
    from trainer.features import FeatureStats
    from trainer.heads import CLASSIFICATION, Head
    from trainer.model import ModelContext, build_tabular_model

    keras.utils.set_random_seed(0)
    kinds = {"bill_length_mm": "float32", "flipper_length_mm": "float32", "island": "string"}
    stats = FeatureStats(numbers={"bill_length_mm": (44.0, 5.0), "flipper_length_mm": (200.0, 14.0)},
                         strings={"island": ["Biscoe", "Dream", "Torgersen"]})
    heads = [Head("species", CLASSIFICATION, vocabulary=["Adelie", "Chinstrap", "Gentoo"])]
    model = build_tabular_model(ModelContext(kinds, stats, heads))
    export_saved_model(model, kinds, heads, str(path))
    return path


def measure(call, concurrency: int, seconds: float = SECONDS, cpu=None) -> dict:
    """Runs `call` in `concurrency` threads for `seconds` (after a short warm-up). `cpu`: the
    server process's CPU seconds so far; read at the window's start and end, it gives the server's
    CPU microseconds per answered request (steadier than req/s on a shared machine)."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0]
    start_at = time.perf_counter() + 1.0
    stop_at = start_at + seconds
    cpu_marks: list[float] = []

    def worker(out):
        call()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            try:
                call()
            except Exception:  # noqa: BLE001 - counted, not fatal
                errors[0] += 1
                continue
            t1 = time.perf_counter()
            if t0 >= start_at:
                out.append(t1 - t0)

    def sample_cpu():
        for at in (start_at, stop_at):
            time.sleep(max(0.0, at - time.perf_counter()))
            cpu_marks.append(cpu())

    threads = [threading.Thread(target=worker, args=(latencies[i],)) for i in range(concurrency)]
    if cpu is not None:
        threads.append(threading.Thread(target=sample_cpu))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    all_ms = np.array([x for lat in latencies for x in lat]) * 1000
    result = {"p50_ms": round(float(np.percentile(all_ms, 50)), 3), "p99_ms": round(float(np.percentile(all_ms, 99)), 3),
              "req_per_s": round(len(all_ms) / seconds, 1), "errors": errors[0], "requests": len(all_ms)}
    if cpu is not None:
        result["server_cpu_us_per_request"] = round((cpu_marks[1] - cpu_marks[0]) / len(all_ms) * 1e6, 1)
    return result


def free_port() -> int:
    return portpicker.pick_unused_port()


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up in {timeout}s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def row_arrays() -> dict[str, np.ndarray]:
    """ROW as predict_raw takes it: one `[1, 1]` array per input."""
    return {"bill_length_mm": np.array([[ROW["bill_length_mm"]]], np.float32),
            "flipper_length_mm": np.array([[ROW["flipper_length_mm"]]], np.float32),
            "island": np.array([[ROW["island"].encode()]], dtype=object)}


def in_process(saved_model: Path) -> dict:
    import tensorflow as tf

    fn = tf.saved_model.load(str(saved_model)).signatures["predict_raw"]
    inputs = {name: tf.constant(array) for name, array in row_arrays().items()}

    def call():
        return {k: v.numpy() for k, v in fn(**inputs).items()}

    return {f"c{c}": measure(call, c) for c in CONCURRENCY}


def in_process_session(saved_model: Path) -> dict:
    """The server's own way of calling the model (a Session callable, serving/signature_call.py),
    in process at 1 client: what is left of our overhead once the model call costs the same."""
    from serving.request_limits import RequestLimits
    from serving.servable import Servable

    servable = Servable("penguins", 1, str(saved_model), None, RequestLimits())
    inputs = row_arrays()
    try:
        return {"c1": measure(lambda: servable.run("predict_raw", inputs), 1)}
    finally:
        servable.unload()


PART_CALLS = 5000


def handler_parts(serving_root: Path) -> dict:
    """Where a Predict's time goes in our own code: each part's CPU microseconds per call, in this
    process, one thread, PART_CALLS calls after a warm-up. Caches are warm here; in the server the
    clients, grpc's threads and other requests share the core between two requests, so each part
    costs more there. `grpc_handler` is the servicer's Predict (batching on, as SERVER_SETTINGS)
    with a stand-in for grpc's context: all our work per request, none of grpc's."""
    from tensorflow_serving.apis import predict_pb2

    from serving.config import ServingConfig
    from serving.grpc_server import PredictionServicer
    from serving.options import ServerOptions
    from serving.request_limits import RequestLimits
    from serving.server import ModelServer
    from serving.service import predict_on
    from serving.tensors import from_numpy, to_numpy

    class Context:  # what the handler uses of grpc.ServicerContext
        def invocation_metadata(self):
            return ()

        def set_trailing_metadata(self, metadata):
            pass

        def abort(self, code, message):
            raise RuntimeError(f"{code}: {message}")

    config = ServingConfig()
    config.batching.num_batch_threads = 1
    models_config = str(serving_root / "models.config")
    server = ModelServer(str(serving_root), config, models_config,
                         ServerOptions(models_config=models_config, rest_enabled=False, grpc_tcp=False))
    server.manager.start()
    try:
        request, context = predict_request(), Context()
        handler = PredictionServicer(server.manager, server.metrics)
        with server.manager.resolve(request.model_spec) as servable:
            def parse():
                return {alias: to_numpy(request.inputs[alias], alias, RequestLimits().budget()) for alias in request.inputs}

            arrays = parse()
            outputs = servable.run("predict_raw", arrays)

            def response():
                answer = predict_pb2.PredictResponse()
                for name, array in outputs.items():
                    from_numpy(array, answer.outputs[name], as_fields=True)

            parts = {"parse": parse,
                     "model": lambda: servable.run("predict_raw", arrays), "response": response,
                     "predict_on": lambda: predict_on(servable, request, False),
                     "grpc_handler": lambda: handler.Predict(request, context)}
            return {name: _cpu_us_per_call(call) for name, call in parts.items()}
    finally:
        server.stop(grace=0)


def _cpu_us_per_call(call) -> float:
    for _ in range(PART_CALLS // 10):
        call()
    started = time.process_time()
    for _ in range(PART_CALLS):
        call()
    return round((time.process_time() - started) / PART_CALLS * 1e6, 2)


def tflite_version(saved_model: Path, version_dir: Path) -> Path:
    """The SavedModel with its float32 TFLite variant as model.tflite: the version folder a push
    with serving.tflite_variant=float32 writes, served with serving.prefer_tflite."""
    from serving.signature_names import TFLITE_MODEL_FILE
    from trainer import tflite

    shutil.copytree(saved_model, version_dir)
    (version_dir / TFLITE_MODEL_FILE).write_bytes(tflite.convert_variants(str(saved_model), ["float32"])["float32"])
    return version_dir


def predict_request():
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "penguins"
    request.model_spec.signature_name = "predict_raw"
    request.inputs["bill_length_mm"].CopyFrom(tf.make_tensor_proto([[ROW["bill_length_mm"]]], tf.float32))
    request.inputs["flipper_length_mm"].CopyFrom(tf.make_tensor_proto([[ROW["flipper_length_mm"]]], tf.float32))
    request.inputs["island"].CopyFrom(tf.make_tensor_proto([[ROW["island"].encode()]]))
    return request


def grpc_clients(port: int, concurrency=CONCURRENCY, pid: int | None = None) -> dict:
    """The stock PredictionService stub, one channel per client thread, sending the same request;
    `pid`: the server's process, whose CPU per request is then measured too."""
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    request = predict_request()
    results = {}
    for c in concurrency:
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range(c)]
        stubs = [prediction_service_pb2_grpc.PredictionServiceStub(ch) for ch in channels]
        local = threading.local()
        counter = iter(range(c))
        lock = threading.Lock()

        def call():
            if not hasattr(local, "stub"):
                with lock:
                    local.stub = stubs[next(counter)]
            return local.stub.Predict(request, timeout=10)

        results[f"c{c}"] = measure(call, c, cpu=server_cpu(pid))
        for ch in channels:
            ch.close()
    return results


def _env(repo: Path = REPO) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))


# The server's settings here: the clients share the machine, so the server is pinned to one core
# (serving.cpus; the last one) and runs one batch at a time (two batch threads: ~15% fewer
# requests/s at 16 clients on 2 cores). The no-model gRPC server is pinned the same way.
SERVER_CPU = max(os.sched_getaffinity(0))
SERVER_SETTINGS = [f"serving.cpus=[{SERVER_CPU}]", "serving.batching.num_batch_threads=1"]
# REST against mlflow: both unpinned, each with its own defaults.
REST_SETTINGS: list[str] = []


TFLITE_SETTINGS = [*SERVER_SETTINGS, "serving.prefer_tflite=true"]  # the same server, the model through LiteRT
REST_BODY = json.dumps({"signature_name": "predict_raw", "instances": [{k: [v] for k, v in ROW.items()}]}).encode()


def rest_clients(url: str, body: bytes, concurrency=CONCURRENCY, pid: int | None = None) -> dict:
    """POSTs `body` to `url`, one kept-alive requests.Session per client thread. `pid`: the server
    process whose CPU per request is measured too."""
    import requests

    results = {}
    for c in concurrency:
        local = threading.local()

        def call():
            if not hasattr(local, "session"):
                local.session = requests.Session()
            response = local.session.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=10)
            response.raise_for_status()
            return response

        results[f"c{c}"] = measure(call, c, cpu=server_cpu(pid))
    return results


def ours(serving_root: Path, settings=SERVER_SETTINGS, api: str = "grpc", concurrency=CONCURRENCY,
         metrics: list | None = None, cached_answer: bool = False, repo: Path = REPO) -> dict:
    """`metrics`: gets the server's Prometheus text after the clients, before it stops, and the
    server process's CPU seconds while they ran. `cached_answer`: the model's call answered from a
    cache (bench/cached_answer_server.py), the server's own cost around the model. `repo`: the
    checkout whose server code runs (another commit's, for a before/after)."""
    grpc_port, rest_port = free_port(), free_port()
    module = "bench.cached_answer_server" if cached_answer else "pipeline.cli"
    proc = subprocess.Popen([sys.executable, "-m", module, "serve", "--serving-root", str(serving_root),
                             "--grpc-port", str(grpc_port), "--rest-port", str(rest_port),
                             *[a for s in settings for a in ("--set", s)]],
                            cwd=repo, env=_env(repo), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{rest_port}/v1/models/penguins", proc)
        if api == "rest":
            return rest_clients(f"http://127.0.0.1:{rest_port}/v1/models/penguins:predict", REST_BODY, pid=proc.pid)
        cpu_before = process_cpu_seconds(proc.pid)
        result = grpc_clients(grpc_port, concurrency, pid=proc.pid)
        if metrics is not None:
            import requests

            metrics.append(requests.get(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics", timeout=10).text)
            metrics.append(process_cpu_seconds(proc.pid) - cpu_before)
        return result
    finally:
        stop(proc)


LOGGING_RATES = (0.0, 0.1, 1.0)
LOGGING_ROUNDS = 3


def request_logging(serving_root: Path, work: Path) -> dict:
    """Request logging's cost: the gRPC clients at 16 against the same server with
    serving.request_log.sampling_rate 0, 0.1 and 1.0, interleaved over LOGGING_ROUNDS rounds (the
    machine's other load shifts between points), each rate's req/s the mean of its rounds, and
    the server process's CPU microseconds per answered request (steadier than req/s when other
    work shares the machine: it counts what the server spent, not what it was given); and
    at 1.0 the records in the closed files against the requests the server answered (its
    Prometheus counters, read before it stops) and the records it dropped."""
    from serving.request_log_files import closed_files, read_index

    points: dict[float, list[float]] = {rate: [] for rate in LOGGING_RATES}
    cpu: dict[float, list[float]] = {rate: [] for rate in LOGGING_RATES}
    written = answered = dropped = 0
    ok = 'loopline_requests_total{api="grpc",model="penguins",method="Predict",code="OK"}'
    for round_ in range(LOGGING_ROUNDS):
        for rate in LOGGING_RATES:
            root = work / f"logging-{round_}-{rate:g}"
            settings = [*SERVER_SETTINGS, f"pipeline.root={root}", f"serving.request_log.sampling_rate={rate}"]
            metrics: list = []
            points[rate].append(ours(serving_root, settings, concurrency=(16,), metrics=metrics)["c16"]["req_per_s"])
            served = _counter(metrics[0], ok)
            cpu[rate].append(round(metrics[1] / served * 1e6, 1))  # server CPU microseconds per answered request
            if rate == 1.0:
                files = closed_files(str(root / "request_logs"), "penguins")
                written += sum(len(read_index(f)) for f in files)
                answered += served
                dropped += _counter(metrics[0], "loopline_request_log_dropped_total")
    out = {f"sampling_{rate:g}": {"req_per_s": round(float(np.mean(points[rate])), 1), "rounds": points[rate],
                                  "cpu_us_per_request": round(float(np.mean(cpu[rate])), 1), "cpu_rounds": cpu[rate]}
           for rate in LOGGING_RATES}
    base = out["sampling_0"]
    for rate in LOGGING_RATES[1:]:
        point = out[f"sampling_{rate:g}"]
        out[f"cost_at_{rate:g}"] = round(1 - point["req_per_s"] / base["req_per_s"], 3)
        out[f"cpu_cost_at_{rate:g}"] = round(point["cpu_us_per_request"] / base["cpu_us_per_request"] - 1, 3)
    out["records_written_at_1"], out["requests_answered_at_1"], out["records_dropped_at_1"] = written, answered, dropped
    out["cpu_us_per_logged_request"] = logging_cpu_per_record(serving_root, work)
    out["cpu_cost_at_1_from_parts"] = round(out["cpu_us_per_logged_request"] / base["cpu_us_per_request"], 3)
    return out


def logging_cpu_per_record(serving_root: Path, work: Path, records: int = 20000) -> float:
    """The CPU microseconds request logging spends per logged request, in this process, one thread:
    the request path's part (RequestLog.log) and the writer's (the record built, written into the
    GZIP file with its index row), on the clients' request and the answer the server gives it.
    Divided by the server's CPU per request at sampling 0, it is the cost at 1.0 that the noisy
    req/s of a shared machine hides."""
    from serving.request_log import RequestLog
    from serving.request_log_config import RequestLogConfig, write_request_log_file
    from serving.request_limits import RequestLimits
    from serving.servable import Servable
    from serving.service import predict_on

    servable = Servable("penguins", 1, str(serving_root / "penguins" / "1"), None, RequestLimits())
    request = predict_request()
    response = predict_on(servable, request, False)
    servable.unload()
    settings_root = work / "logging-cpu"
    write_request_log_file(str(settings_root), RequestLogConfig(sampling_rate=1.0, queue_size=records),
                           str(settings_root / "request_logs"))
    logger = RequestLog(str(settings_root))
    logger.reload_settings()
    started = time.process_time()
    for _ in range(records):
        logger.log(request, response)
    while logger._queue:  # noqa: SLF001 - the writer's own loop, without its 50 ms sleeps
        logger._write(logger._queue.popleft())  # noqa: SLF001
    logger._close_all()  # noqa: SLF001
    return round((time.process_time() - started) / records * 1e6, 2)


def _counter(text: str, prefix: str) -> int:
    """The sum of the Prometheus samples whose line starts with `prefix`."""
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)))


INFER_EXAMPLES = int(os.environ.get("LOOPLINE_BENCH_INFER_EXAMPLES", "100000"))


def batch_inference(work: Path) -> dict:
    """`loopline infer` (pipeline.infer) on INFER_EXAMPLES tf.Examples of ROW in a GZIP TFRecord,
    pinned to the server's core like the server, its whole run timed (the model's load included)."""
    import tensorflow as tf

    from pipeline.config import load_config
    from pipeline.infer import infer

    example = tf.train.Example()
    for name, value in ROW.items():
        feature = example.features.feature[name]
        feature.bytes_list.value.append(value.encode()) if isinstance(value, str) else feature.float_list.value.append(value)
    data = work / "infer.tfrecord.gz"
    with tf.io.TFRecordWriter(str(data), options="GZIP") as writer:
        for _ in range(INFER_EXAMPLES):
            writer.write(example.SerializeToString())
    config = load_config(None, [f"pipeline.root={work}", "mlflow.enabled=false"])
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {SERVER_CPU})
    try:
        result = infer(config, str(data), str(work / "predictions.parquet"), version=1, data_format="tfrecord",
                       progress=False)
    finally:
        os.sched_setaffinity(0, cpus)
    return {"examples": result.examples, "seconds": round(result.seconds, 3),
            "examples_per_s": round(result.examples_per_second, 1), "pinned_to_cpu": SERVER_CPU}


def server_cpu(pid: int | None):
    """`measure`'s `cpu`: the server process's CPU seconds so far, or None when no process is named."""
    return None if pid is None else lambda: process_cpu_seconds(pid)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its threads, and of the processes it started
    (Linux /proc): `loopline serve` runs its server in a child process (serving.supervise)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    children = [int(child) for task in Path(f"/proc/{pid}/task").glob("*/children") for child in task.read_text().split()]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(map(process_cpu_seconds, children))


def grpc_floor(concurrency=CONCURRENCY, inline: bool = False) -> dict:
    """The same clients against a server that runs no model (bench/grpc_floor.py), pinned to the
    same core as ours, with the same number of gRPC worker threads; grpcio's stock server, or
    (`inline`) the transport ours runs on."""
    from serving.config import ServingConfig

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", str(port), str(SERVER_CPU),
                             str(ServingConfig().grpc_workers), *(["inline"] if inline else [])], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if "serving" not in proc.stdout.readline():
            raise RuntimeError("bench.grpc_floor did not start")
        return grpc_clients(port, concurrency=concurrency, pid=proc.pid)
    finally:
        stop(proc)


FLOOR_ROUNDS = 3


def against_floor(serving_root: Path, tflite_root: Path) -> dict:
    """Our gRPC server against the no-model server (grpcio's stock server: the floor the targets
    name), at 1 and 16 clients, same settings (pinned to SERVER_CPU, 32 gRPC workers), alternating
    FLOOR_ROUNDS times: per round, our p50 over the floor's at 1 client and our req/s over the
    floor's at 16; the medians of the rounds. Each round also measures the no-model server on our
    own transport (`inline_floor`), which splits what is left into transport and handler, and our
    server with the model's call answered from a cache (`loopline_grpc_cached_answer`), which
    splits it into the model's call and the rest of our server; and our server with the model's
    float32 TFLite variant served through the interpreter (`loopline_grpc_tflite`, serving.prefer_tflite)."""
    from serving.config import ServingConfig

    rounds = []
    for _ in range(FLOOR_ROUNDS):
        ours_now, cached_now = ours(serving_root), ours(serving_root, cached_answer=True)
        tflite_now = ours(tflite_root, settings=TFLITE_SETTINGS)
        floor_now, inline_now = grpc_floor(), grpc_floor(inline=True)
        rounds.append({"loopline_grpc": ours_now, "loopline_grpc_cached_answer": cached_now,
                       "loopline_grpc_tflite": tflite_now, "grpc_floor": floor_now,
                       "inline_floor": inline_now, **_over_floor(ours_now, floor_now),
                       **{f"cached_answer_{k}": v for k, v in _over_floor(cached_now, floor_now).items()},
                       **{f"tflite_{k}": v for k, v in _over_floor(tflite_now, floor_now).items()}})
    settings = (f"all pinned to CPU {SERVER_CPU}, {ServingConfig().grpc_workers} gRPC worker threads; ours on its inline "
                "transport (serving/grpc_transport.py), the floor on grpcio's stock server, the inline floor on ours; "
                "ours also: " + ", ".join(SERVER_SETTINGS[1:]) + "; cached answer: ours, the model's call answered "
                "from a cache (bench/cached_answer_server.py); tflite: ours with serving.prefer_tflite on the "
                "model's float32 variant")
    return {"rounds": rounds, **floor_medians(rounds), "settings": settings}


def _over_floor(side: dict, floor: dict) -> dict:
    """A server's p50 over the floor's at 1 client and its req/s as a fraction of the floor's at 16."""
    return {"p50_over_floor_ms_c1": round(side["c1"]["p50_ms"] - floor["c1"]["p50_ms"], 3),
            "req_per_s_fraction_c16": round(side["c16"]["req_per_s"] / floor["c16"]["req_per_s"], 3)}


def floor_medians(rounds: list[dict]) -> dict:
    """The headline figures: the median over the rounds of each round's difference and ratio; and
    each server's CPU microseconds per request at 16 clients (the median of its rounds)."""
    def median(get, digits: int = 3) -> float:
        return round(float(np.median([get(r) for r in rounds])), digits)

    sides = [side for side in ("loopline_grpc", "loopline_grpc_cached_answer", "loopline_grpc_tflite", "grpc_floor",
                               "inline_floor") if all(side in r for r in rounds)]
    cpu = {side: median(lambda r: r[side]["c16"]["server_cpu_us_per_request"], 1)
           for side in sides if all("server_cpu_us_per_request" in r[side]["c16"] for r in rounds)}
    inline = {f"inline_floor_{key}": median(lambda r: r["inline_floor"][c][field])
              for key, c, field in (("p50_ms_c1", "c1", "p50_ms"), ("req_per_s_c16", "c16", "req_per_s"))
              if "inline_floor" in sides}
    cached = {f"cached_answer_{key}": median(lambda r: r[f"cached_answer_{key}"])
              for key in ("p50_over_floor_ms_c1", "req_per_s_fraction_c16")
              if "loopline_grpc_cached_answer" in sides}
    tflite = {f"tflite_{key}": median(lambda r: r[f"tflite_{key}"])
              for key in ("p50_over_floor_ms_c1", "req_per_s_fraction_c16") if "loopline_grpc_tflite" in sides}
    return {"server_cpu_us_per_request_c16": cpu, **inline, **cached, **tflite,
            "p50_over_floor_ms_c1": median(lambda r: r["p50_over_floor_ms_c1"]),
            "req_per_s_fraction_of_floor_c16": median(lambda r: r["req_per_s_fraction_c16"]),
            "floor_req_per_s_c16": median(lambda r: r["grpc_floor"]["c16"]["req_per_s"], 1),
            "floor_p50_ms_c1": median(lambda r: r["grpc_floor"]["c1"]["p50_ms"])}


def registered_model(saved_model: Path, folder: Path) -> str:
    """Logs and registers the export as the pipeline's Registrar does (tracking.logged_model, the
    loopline pyfunc) in an embedded store; returns its tracking URI (the model is penguins/1)."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from tracking.logged_model import log_saved_model, register

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("bench", artifact_location=(folder / "artifacts").as_uri())
    run = client.create_run(experiment)
    model_uri = log_saved_model(uri, run.info.run_id, str(saved_model), pd.DataFrame([ROW]))
    client.set_terminated(run.info.run_id)
    register(client, uri, model_uri, "penguins", run.info.run_id, {})
    return uri


def mlflow_serve(tracking_uri: str) -> dict:
    """`mlflow models serve -m models:/penguins/1` (unpinned), one DataFrame row per request."""
    port = free_port()
    # mlflow starts `uvicorn` by name: put this interpreter's bin folder on PATH.
    env = dict(os.environ, MLFLOW_TRACKING_URI=tracking_uri,
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/penguins/1", "-h", "127.0.0.1",
                             "-p", str(port), "--env-manager", "local"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", proc, timeout=180)
        body = json.dumps({"dataframe_split": {"columns": list(ROW), "data": [list(ROW.values())]}}).encode()
        return rest_clients(f"http://127.0.0.1:{port}/invocations", body)
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """mlflow's uvicorn children outlive their parent: stop the whole process group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


RESULTS_FILE = Path(__file__).resolve().parent / "results" / "serving.json"


def previous_runs(path: Path = RESULTS_FILE) -> list:
    """The headline entries of the runs so far, one per run (by its `at`), from the `runs` list each
    whole result in the file carries. Only headline entries are carried on: a whole earlier result
    nested there (as this bench once did) is skipped, or the file doubles with every run."""
    try:
        results = json.loads(path.read_text()).get("runs", [])
    except (OSError, ValueError):
        return []
    entries: dict[str, dict] = {}
    for result in results:
        for entry in result.get("runs", []) if isinstance(result, dict) else []:
            if isinstance(entry, dict) and "at" in entry:
                entries.setdefault(entry["at"], entry)
    return list(entries.values())


def run() -> dict:
    from serving.config import ServingConfig
    from serving.config_writer import write_serving_configs

    work = Path(tempfile.mkdtemp(prefix="loopline-bench-serving-"))
    try:
        serving_root = work / "serving"
        saved_model = export_model(serving_root / "penguins" / "1")
        write_serving_configs(str(serving_root), ServingConfig())
        tflite_root = work / "serving_tflite"
        tflite_version(saved_model, tflite_root / "penguins" / "1")
        write_serving_configs(str(tflite_root), ServingConfig())
        results = {"in_process": in_process(saved_model), "in_process_session": in_process_session(saved_model),
                   "handler_parts_us": handler_parts(serving_root),
                   "vs_grpc_floor": against_floor(serving_root, tflite_root),
                   "loopline_rest": ours(serving_root, settings=REST_SETTINGS, api="rest"),
                   "loopline_rest_tflite": ours(tflite_root, settings=[*REST_SETTINGS, "serving.prefer_tflite=true"],
                                                api="rest"),
                   "mlflow_rest": mlflow_serve(registered_model(saved_model, work)),
                   "request_logging": request_logging(serving_root, work), "infer": batch_inference(work)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # The first round's points stand for the server and the floor in the figures below.
    results["loopline_grpc"] = results["vs_grpc_floor"]["rounds"][0]["loopline_grpc"]
    results["grpc_floor"] = results["vs_grpc_floor"]["rounds"][0]["grpc_floor"]
    results["loopline_grpc_tflite"] = results["vs_grpc_floor"]["rounds"][0]["loopline_grpc_tflite"]
    results["ratio_vs_mlflow_c16"] = round(results["loopline_grpc"]["c16"]["req_per_s"] / results["mlflow_rest"]["c16"]["req_per_s"], 2)
    results["ratio_vs_mlflow_c1"] = round(results["loopline_grpc"]["c1"]["req_per_s"] / results["mlflow_rest"]["c1"]["req_per_s"], 2)
    results["p50_overhead_ms_c1"] = round(results["loopline_grpc"]["c1"]["p50_ms"] - results["in_process"]["c1"]["p50_ms"], 3)
    # Of that overhead, the round trip of a gRPC call that runs no model (minus the in-process
    # call it replaces) is transport; the rest is the server's handler and model call.
    results["grpc_floor_overhead_ms_c1"] = round(results["grpc_floor"]["c1"]["p50_ms"] - results["in_process"]["c1"]["p50_ms"], 3)
    results["p50_overhead_vs_session_ms_c1"] = round(
        results["loopline_grpc"]["c1"]["p50_ms"] - results["in_process_session"]["c1"]["p50_ms"], 3)
    results["infer_vs_grpc_c16"] = round(results["infer"]["examples_per_s"] / results["loopline_grpc"]["c16"]["req_per_s"], 2)
    results["rest_ratio_vs_mlflow_c16"] = round(results["loopline_rest"]["c16"]["req_per_s"] / results["mlflow_rest"]["c16"]["req_per_s"], 2)
    results["targets"] = {"ratio_vs_mlflow_c16": ">= 3", "p50_overhead_ms_c1": "<= 0.5",
                          "rest_ratio_vs_mlflow_c16": ">= 3", "loopline_rest.c1.p50_ms": "<= 2",
                          "request_logging.cost_at_1": "< 0.10", "request_logging.cpu_cost_at_1": "< 0.10",
                          "request_logging.cpu_cost_at_1_from_parts": "< 0.10",
                          "infer_vs_grpc_c16": ">= 5", "vs_grpc_floor.p50_over_floor_ms_c1": "<= 0.05",
                          "vs_grpc_floor.req_per_s_fraction_of_floor_c16": ">= 0.7",
                          "vs_grpc_floor.tflite_p50_over_floor_ms_c1": "<= 0.05",
                          "vs_grpc_floor.tflite_req_per_s_fraction_c16": ">= 0.7"}
    results["setup"] = f"batch 1, {SECONDS:.0f}s per point, clients in one process on the same machine"
    results["loopline_settings"] = {"grpc": SERVER_SETTINGS, "rest": REST_SETTINGS}
    results["runs"] = previous_runs() + [{
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{f"{name}_{c}": {k: results[name][c][k] for k in ("p50_ms", "req_per_s")}
           for name in ("loopline_grpc", "loopline_grpc_tflite", "loopline_rest", "loopline_rest_tflite", "mlflow_rest")
           for c in ("c1", "c16")},
        "ratio_vs_mlflow_c16": results["ratio_vs_mlflow_c16"], "rest_ratio_vs_mlflow_c16": results["rest_ratio_vs_mlflow_c16"],
        "request_logging": {k: v for k, v in results["request_logging"].items() if not isinstance(v, dict)}
        | {f"{k}_req_per_s": v["req_per_s"] for k, v in results["request_logging"].items() if isinstance(v, dict)},
        "infer_examples_per_s": results["infer"]["examples_per_s"], "infer_vs_grpc_c16": results["infer_vs_grpc_c16"],
        "vs_grpc_floor": {k: v for k, v in results["vs_grpc_floor"].items() if k != "rounds"},
        "handler_parts_us": results["handler_parts_us"]}]
    for name in ("in_process", "in_process_session", "loopline_grpc", "loopline_grpc_tflite", "grpc_floor",
                 "loopline_rest", "loopline_rest_tflite", "mlflow_rest"):
        for c in CONCURRENCY:
            if f"c{c}" not in results[name]:
                continue
            r = results[name][f"c{c}"]
            print(f"  {name:20s} c{c:<3d} p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms  {r['req_per_s']:8.1f} req/s")
    floor = results["vs_grpc_floor"]
    print(f"  vs the no-model gRPC server (median of {FLOOR_ROUNDS} rounds): p50 +{floor['p50_over_floor_ms_c1']} ms at "
          f"1 client, {floor['req_per_s_fraction_of_floor_c16']:.1%} of its req/s at 16 "
          f"({floor['floor_req_per_s_c16']} req/s); the model's call answered from a cache: p50 "
          f"+{floor.get('cached_answer_p50_over_floor_ms_c1')} ms, {floor.get('cached_answer_req_per_s_fraction_c16')} "
          f"of its req/s")
    print(f"  the same with the model's float32 TFLite variant (serving.prefer_tflite): p50 "
          f"+{floor.get('tflite_p50_over_floor_ms_c1')} ms at 1 client, {floor.get('tflite_req_per_s_fraction_c16')} "
          f"of its req/s at 16")
    cpu = floor["server_cpu_us_per_request_c16"]
    print(f"  the no-model server on our transport: p50 {floor.get('inline_floor_p50_ms_c1')} ms at 1 client (the "
          f"floor's {floor['floor_p50_ms_c1']}), {floor.get('inline_floor_req_per_s_c16')} req/s at 16")
    print(f"  server CPU per request at 16 clients: ours {cpu.get('loopline_grpc')} us (the model's call answered "
          f"from a cache: {cpu.get('loopline_grpc_cached_answer')} us; TFLite: {cpu.get('loopline_grpc_tflite')} us), "
          f"the no-model server's "
          f"{cpu.get('grpc_floor')} us (on our transport {cpu.get('inline_floor')} us); our code per Predict in "
          f"process (us): {results['handler_parts_us']}")
    logging = results["request_logging"]
    print(f"  request logging at 16 clients: {logging['sampling_0']['req_per_s']} req/s off, "
          f"{logging['sampling_0.1']['req_per_s']} at 0.1 (cost {logging['cost_at_0.1']:.1%}), "
          f"{logging['sampling_1']['req_per_s']} at 1.0 (cost {logging['cost_at_1']:.1%}); server CPU per request "
          f"+{logging['cpu_cost_at_0.1']:.1%} at 0.1, +{logging['cpu_cost_at_1']:.1%} at 1.0; logging's own CPU "
          f"{logging['cpu_us_per_logged_request']} us per logged request ({logging['cpu_cost_at_1_from_parts']:.1%} "
          f"of a request's at 0); "
          f"at 1.0: {logging['records_written_at_1']} records written for {logging['requests_answered_at_1']} "
          f"answered requests, {logging['records_dropped_at_1']} dropped")
    print(f"  loopline infer: {results['infer']['examples_per_s']} examples/s on one core, "
          f"{results['infer_vs_grpc_c16']}x the gRPC server's at 16 clients")
    print(f"  REST vs mlflow at 16 clients: {results['rest_ratio_vs_mlflow_c16']}x; REST p50 at 1 client: "
          f"{results['loopline_rest']['c1']['p50_ms']} ms")
    print(f"  gRPC vs mlflow at 16 clients: {results['ratio_vs_mlflow_c16']}x; "
          f"p50 overhead at 1 client: {results['p50_overhead_ms_c1']} ms "
          f"(a gRPC call that runs no model: {results['grpc_floor']['c1']['p50_ms']} ms; "
          f"vs the server's own call in process: {results['p50_overhead_vs_session_ms_c1']} ms)")
    return results
