"""Logs a loopline SavedModel as an MLflow pyfunc model (signature + input example) and registers
it. MLflow 3 registers logged models only, not plain artifact folders."""
from __future__ import annotations

import contextlib
import json
import os
from importlib import metadata
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.models import infer_signature

from serving import signature_names as names

PYFUNC_CODE = str(Path(__file__).with_name("pyfunc_model.py"))
EXAMPLES_PYFUNC_CODE = str(Path(__file__).with_name("examples_pyfunc.py"))  # a model loopline did not export


def input_example_from_records(saved_model_dir: str, records: list[dict], rows: int = 3) -> pd.DataFrame:
    """A small DataFrame of the model's input features; numbers as float64, so clients may send
    ints or floats. Prefers complete records."""
    import tensorflow as tf

    with tf.io.gfile.GFile(names.signature_file(saved_model_dir)) as f:
        features = json.load(f)["features"]
    complete = [r for r in records if all(r.get(name) is not None for name in features)]
    chosen = (complete or records)[:rows]
    if not chosen:
        chosen = [{}]
    data = {}
    for name, kind in features.items():
        values = [r.get(name) for r in chosen]
        if kind not in ("int64", "float32", "string"):  # lists and images go as they are in the examples
            data[name] = values
        elif kind == "string":
            data[name] = ["" if v is None else str(v) for v in values]
        else:
            data[name] = [float("nan") if v is None else float(v) for v in values]
    return pd.DataFrame(data)


def _requirements() -> list[str]:
    # Explicit pins: MLflow's inference would load the model in a subprocess (slow, imports TF).
    out = []
    for name in ("mlflow", "tensorflow", "pandas", "numpy"):
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return out


def log_saved_model(tracking_uri: str, run_id: str, saved_model_dir: str, input_example: pd.DataFrame,
                    name: str = "model") -> str:
    """Logs the pyfunc model into the run; returns its model URI (`models:/<model id>`)."""
    from tracking.pyfunc_model import SavedModelPyfunc

    # The signature comes from a real prediction on the example.
    wrapper = SavedModelPyfunc()
    wrapper.load_context(type("Context", (), {"artifacts": {"saved_model": saved_model_dir}})())
    signature = infer_signature(input_example, wrapper.predict(None, input_example))

    with fluent_tracking_uri(tracking_uri), pins_checked_without_module_map(), \
            mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=PYFUNC_CODE,
            artifacts={"saved_model": saved_model_dir},
            signature=signature,
            input_example=input_example,
            pip_requirements=_requirements(),
        )
    return info.model_uri


def _record_kind(values: list) -> str | None:
    """A column's kind (examples_pyfunc's int64, float32, string) from its values in the records."""
    for value in values:
        first = value[0] if isinstance(value, list) and value else value
        if isinstance(first, (str, bytes)):
            return "string"
        if isinstance(first, bool) or isinstance(first, int):
            return "int64"
        if isinstance(first, float):
            return "float32"
    return None


def log_examples_model(tracking_uri: str, run_id: str, saved_model_dir: str, signature: str, records: list[dict],
                       labels: set[str], name: str = "model") -> str:
    """Logs a SavedModel loopline did not export (a TFX run_fn's) as examples_pyfunc's pyfunc model:
    its `signature` (one input of serialized tf.Examples) called on rows of the records' columns,
    the `labels` left out; returns its model URI."""
    import tempfile

    import tensorflow as tf

    from tracking.examples_pyfunc import ExamplesPyfunc

    function = tf.saved_model.load(saved_model_dir).signatures[signature]
    columns = sorted({k for r in records for k in r} - labels)
    kinds = {c: kind for c in columns if (kind := _record_kind([r.get(c) for r in records if r.get(c) is not None]))}
    spec = {"signature": signature, "input": next(iter(function.structured_input_signature[1])), "features": kinds}
    complete = [r for r in records if all(r.get(c) is not None for c in kinds)] or records
    example = pd.DataFrame({c: [r.get(c) for r in complete[:3]] for c in kinds})
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = os.path.join(tmp, "examples_spec.json")
        with open(spec_path, "w") as f:  # a local file MLflow copies into the logged model
            json.dump(spec, f)
        artifacts = {"saved_model": saved_model_dir, "examples_spec": spec_path}
        wrapper = ExamplesPyfunc()
        wrapper.load_context(type("Context", (), {"artifacts": artifacts})())
        with fluent_tracking_uri(tracking_uri), pins_checked_without_module_map(), \
                mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
            info = mlflow.pyfunc.log_model(name=name, python_model=EXAMPLES_PYFUNC_CODE, artifacts=artifacts,
                                           signature=infer_signature(example, wrapper.predict(None, example)),
                                           input_example=example, pip_requirements=_requirements())
    return info.model_uri


@contextlib.contextmanager
def pins_checked_without_module_map():
    """MLflow checks each pin against the installed version (`importlib.metadata.version`), but first
    maps every installed distribution to its modules (`packages_distributions()`, a stat of every
    file of every distribution: 0.7-2 CPU seconds a process). The map only serves to import a pinned
    package that has no distribution metadata, which `_requirements` never pins; so while the model
    is logged the map starts empty, and the versions are still compared. A map already built, or an
    MLflow without this module state, is left as it is."""
    from mlflow.utils import requirements_utils

    if getattr(requirements_utils, "_MODULES_TO_PACKAGES", "absent") is not None:
        yield
        return
    requirements_utils._MODULES_TO_PACKAGES = {}
    try:
        yield
    finally:
        requirements_utils._MODULES_TO_PACKAGES = None
        requirements_utils._PACKAGES_TO_MODULES = None


@contextlib.contextmanager
def fluent_tracking_uri(uri: str):
    """MLflow's fluent API (log_model, and the registry resolving `models:/` sources) reads a
    process-wide URI; point it at ours for the duration only."""
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    # Restore the raw settings (not the resolved defaults), so nothing stays pinned afterwards.
    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri,
             {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")})
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved[0])
        registry_utils._registry_uri = saved[1]
        for key, value in saved[2].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def register(client, tracking_uri: str, model_uri: str, registered_model: str, run_id: str, tags: dict[str, str]):
    """Creates the registered model if needed and a new version from the logged model."""
    try:
        client.get_registered_model(registered_model)
    except Exception:
        client.create_registered_model(registered_model, description="Registered by loopline pipeline runs.")
    model_id = model_uri.rsplit("/", 1)[-1]  # models:/<model id>, as mlflow.register_model does
    with fluent_tracking_uri(tracking_uri):
        return client.create_model_version(registered_model, model_uri, run_id=run_id, tags=tags, model_id=model_id)
