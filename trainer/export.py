"""SavedModel export with TF Serving's signatures (names in serving/signature_names.py).

- `classify_<head>` per classification head (method classify): input `inputs` (serialized
  tf.Examples), outputs `classes` and `scores`, as TF Serving's Classify requires.
- `regress_<head>` per regression head (method regress): input `inputs`, output `outputs`.
- `serving_default`: the default head's (`data.label`'s) classify or regress signature.
- `predict` (method predict): input `inputs`, every head's outputs as `<head>_classes`,
  `<head>_scores`, `<head>_outputs`.
- `predict_raw`: one `[batch, ...feature shape]` tensor per feature (float32 numbers and decoded
  images, strings), JSON friendly;
  outputs named as `named_outputs` says.

A model without heads (a GAN's generator: a latent vector in, an image out) reads no tf.Example:
it is served as itself (`export_as_itself`).
"""
from __future__ import annotations

import json
import logging
import os

import keras
import numpy as np
import tensorflow as tf

from serving import signature_names as names
from serving.signature_names import signature_name, signature_names_of
from trainer.evaluation import label_kinds, prediction_key, read_examples
from trainer.export_config import ExportConfig
from trainer.features import FeatureKinds, feature_shape, is_number, parse_examples
from trainer.heads import CLASSIFICATION, Head
from trainer.transform_graph import InputTransform
from trainer import tflite
from trainer.warmup import predict_log, write_logs, write_warmup

log = logging.getLogger("loopline.export")
REPORT_JSON = "export_report.json"
REPORT_MD = "export_report.md"
TFLITE_DIR = "Format-TFLite"


def named_outputs(heads: list[Head], outputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """The signatures' outputs, TF Serving's names for the first head: `classes` and `scores`
    (classification) or `outputs` (regression); further heads' are prefixed or named after them."""
    named = {}
    for head in heads:
        prediction = outputs[head.name]
        key = prediction_key(heads, head)
        if head.kind == CLASSIFICATION:
            batch = tf.shape(prediction)[0]
            named[key.removesuffix("scores") + "classes"] = tf.tile(tf.constant(head.vocabulary)[tf.newaxis, :], [batch, 1])
        named[key] = prediction
    return named


def raw_input_spec(kinds: FeatureKinds) -> dict[str, tf.TensorSpec]:
    return {
        signature_name(column): tf.TensorSpec([None, *feature_shape(kind)], tf.float32 if is_number(kind) else tf.string,
                                              name=signature_name(column))
        for column, kind in kinds.items()
    }


def _vocabulary(head: Head, prediction: tf.Tensor) -> tf.Tensor:
    """`[batch, classes]` class names, as TF Serving's Classify wants them beside the scores."""
    return tf.tile(tf.constant(head.vocabulary)[tf.newaxis, :], [tf.shape(prediction)[0], 1])


def head_outputs(head: Head, prediction: tf.Tensor) -> dict[str, tf.Tensor]:
    """A head's classify (`classes`, `scores`) or regress (`outputs`) signature outputs."""
    if head.kind == CLASSIFICATION:
        return {names.CLASSES: _vocabulary(head, prediction), names.SCORES: prediction}
    return {names.OUTPUTS: prediction}


def predict_outputs(heads: list[Head], outputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Every head's outputs for the `predict` signature, prefixed with the head's name."""
    return {names.head_output(h.name, key): value for h in heads for key, value in head_outputs(h, outputs[h.name]).items()}


def head_signature(head: Head) -> tuple[str, str]:
    """(signature name, method name) of a head's own signature."""
    if head.kind == CLASSIFICATION:
        return names.classify(head.name), names.CLASSIFY_METHOD
    return names.regress(head.name), names.REGRESS_METHOD


def default_head(heads: list[Head], name: str | None) -> Head:
    """The head behind `serving_default`: `name` (data.label), else the first."""
    if not heads:
        raise ValueError("the model has no heads (no label columns): there is nothing to serve")
    if name is None:
        return heads[0]
    for head in heads:
        if name in (head.name, head.label_column):
            return head
    raise ValueError(f"default head '{name}' is not one of the model's heads {[h.name for h in heads]}")


def export_saved_model(model: keras.Model, kinds: FeatureKinds, heads: list[Head], export_dir: str,
                       default: str | None = None, transform: InputTransform | None = None) -> str:
    """Writes the SavedModel to `export_dir` (`default`: the head behind `serving_default`,
    None: the first); returns it. With `transform` (a Transform step's graph), the signatures take
    its raw features and run the graph before the model."""
    default_name = default_head(heads, default).name
    if transform is not None:
        kinds = transform.raw_kinds

    examples = [tf.TensorSpec([None], tf.string, name=names.INPUTS)]

    # Functions the signatures share, each traced and saved once rather than once per signature
    # (a load of the SavedModel, the server's too, deserializes every saved function). The model's
    # call is shared with predict_raw where the parsed features have its input spec (else traced again).
    # The signatures call them as concrete functions: tf.saved_model.save traces every signature
    # again inside its save context (part of tf.function's cache key), and a tf.function called
    # there would be traced again with it: the parse and the model's call built twice.
    call_model = tf.function(lambda features: model(transform(features) if transform else features, training=False),
                             autograph=False)
    call_raw = call_model.get_concrete_function(raw_input_spec(kinds))

    @tf.function(input_signature=examples, autograph=False)
    def parse_and_predict(serialized):  # labels may be present in served examples; parse only the inputs
        return call_model(parse_examples(serialized, kinds))

    predictions = parse_and_predict.get_concrete_function()

    archive = keras.export.ExportArchive()
    archive.track(model)
    if transform is not None:
        archive.track(transform.layer)  # the graph's tables and vocabulary files
    methods = {}
    def serve_head(head):  # a closure: tf.function traces default arguments
        return lambda inputs: head_outputs(head, predictions(inputs)[head.name])

    for head in heads:
        name, method = head_signature(head)
        for key in ([name, names.DEFAULT] if head.name == default_name else [name]):
            archive.add_endpoint(key, serve_head(head), input_signature=examples)
            methods[key] = method
    archive.add_endpoint(names.PREDICT, lambda inputs: predict_outputs(heads, predictions(inputs)), input_signature=examples)
    archive.add_endpoint(names.PREDICT_RAW, lambda features: named_outputs(heads, call_raw(features)),
                         input_signature=[raw_input_spec(kinds)])
    archive.write_out(export_dir, verbose=False)
    set_method_names(export_dir, methods)
    # Readers that must not load TensorFlow (the serving config writer, clients) use this.
    columns = [*kinds, *(h.label_column for h in heads)]
    description = {"features": kinds, "heads": [h.to_json() for h in heads], "layout": names.LAYOUT,
                   "default_head": default_name, "signature_names": signature_names_of(columns)}
    assets = os.path.join(export_dir, names.ASSETS_EXTRA)
    tf.io.gfile.makedirs(assets)
    with tf.io.gfile.GFile(names.signature_file(export_dir), "w") as f:
        f.write(json.dumps(description, indent=2))
    return export_dir


def own_input_spec(model: keras.Model) -> dict[str, tf.TensorSpec]:
    """A model's own inputs, by their names (e.g. a generator's latent vector)."""
    return {t.name: tf.TensorSpec(t.shape, t.dtype, name=t.name) for t in model.inputs}


def export_as_itself(model: keras.Model, export_dir: str) -> str:
    """A model without heads has no tf.Example to read: `serving_default` (method predict, as TF
    Serving's Predict and REST `:predict` call it) takes its own inputs by name and returns its
    outputs by name. Returns `export_dir`."""
    def serve(inputs):  # the inputs in the structure the model was built with (one tensor, a list, a dict)
        outputs = model(keras.tree.map_structure(lambda t: inputs[t.name], model.input), training=False)
        return outputs if isinstance(outputs, dict) else dict(zip(model.output_names, tf.nest.flatten(outputs)))

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(names.DEFAULT, serve, input_signature=[own_input_spec(model)])
    archive.write_out(export_dir, verbose=False)
    set_method_names(export_dir, {names.DEFAULT: names.PREDICT_METHOD})
    return export_dir


def set_method_names(export_dir: str, methods: dict[str, str]) -> None:
    """Sets the signatures' method names in saved_model.pb (TF2 writes every one as predict;
    TF Serving checks them with --enable_signature_method_name_check)."""
    from tensorflow.core.protobuf import saved_model_pb2

    path = os.path.join(export_dir, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(path, "rb") as f:
        proto.ParseFromString(f.read())
    for meta_graph in proto.meta_graphs:
        for key, method in methods.items():
            meta_graph.signature_def[key].method_name = method
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(proto.SerializeToString())


def float32_model(model: keras.Model) -> keras.Model:
    """The model itself when it computes in float32; otherwise a float32 copy with the same
    weights (a mixed-precision graph serves slowly on CPUs and does not convert to TFLite)."""
    policies = {layer.dtype_policy.name for layer in model._flatten_layers(include_self=False)}
    if policies <= {"float32"}:
        return model

    def to_float32(node):
        if isinstance(node, dict):
            if node.get("class_name") == "DTypePolicy" or node.get("class_name") == "FloatDTypePolicy":
                return "float32"
            return {k: to_float32(v) for k, v in node.items()}
        if isinstance(node, list):
            return [to_float32(v) for v in node]
        if isinstance(node, str) and node.startswith("mixed_"):
            return "float32"
        return node

    config = to_float32(keras.saving.serialize_keras_object(model))
    copy = keras.saving.deserialize_keras_object(config)
    copy.set_weights([np.asarray(w, np.float32) for w in model.get_weights()])
    return copy


def _parsed_numpy(examples: list[bytes], kinds: dict[str, str]) -> dict[str, np.ndarray]:
    parsed = parse_examples(tf.constant(examples), kinds)
    return {k: v.numpy() for k, v in parsed.items()}


def folder_bytes(path: str) -> int:
    return sum(tf.io.gfile.stat(os.path.join(d, f)).length for d, _, files in tf.io.gfile.walk(path) for f in files)


def write_file(path: str, content: str | bytes) -> None:
    """Through tf.io.gfile: artifact folders may be on gs:// or another remote filesystem."""
    with tf.io.gfile.GFile(path, "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)


def signatures_of(loaded) -> dict:
    out = {}
    for name, fn in loaded.signatures.items():
        inputs = fn.structured_input_signature[1]
        out[name] = {
            "inputs": {k: {"dtype": v.dtype.name, "shape": v.shape.as_list()} for k, v in sorted(inputs.items())},
            "outputs": {k: {"dtype": v.dtype.name, "shape": v.shape.as_list()} for k, v in sorted(fn.structured_outputs.items())},
        }
    return out


def export_model(model: keras.Model, kinds: FeatureKinds, heads: list[Head], metrics: dict[str, float],
                 serving_dir: str, artifact_dir: str, train_pattern: str, eval_pattern: str,
                 config: ExportConfig, default: str | None = None, exported: dict | None = None,
                 transform: InputTransform | None = None) -> dict:
    """The whole export: float32 SavedModel with warmup, TFLite variants behind the parity gate,
    and the report (`export_report.json`/`.md` in `artifact_dir`). `default`: the head behind
    `serving_default` (data.label). `exported`: which weights these are (TrainResult.exported:
    the epoch and step, the metric that selected them). A variant that does not convert or is
    over its tolerance is dropped (file removed, the miss in the report); when it is one of
    `config.required_variants`, tflite.ParityError is raised after the report is written.
    `transform`: a Transform step's graph before the model (the patterns: raw examples)."""
    model = float32_model(model)
    if not heads:
        return _export_without_heads(model, metrics, serving_dir, artifact_dir, config)
    export_saved_model(model, kinds, heads, serving_dir, default, transform)
    if transform is not None:
        kinds = transform.raw_kinds  # what the signatures take
    eval_examples = read_examples(eval_pattern, config.parity_examples)
    if not eval_examples:
        raise ValueError(f"no eval examples in {eval_pattern}")
    features = _parsed_numpy(eval_examples, kinds)
    labels = _parsed_numpy(eval_examples, label_kinds(heads))
    warm = min(config.warmup_examples, len(eval_examples))
    write_warmup(serving_dir, eval_examples[:warm], {k: v[:warm] for k, v in features.items()},
                 head_signature(default_head(heads, default))[1])

    loaded = tf.saved_model.load(serving_dir)
    raw = loaded.signatures[tflite.SIGNATURE]
    reference = tflite.run_saved_model(raw, features)
    one = {k: v[:1] for k, v in features.items()}
    report = {
        "signatures": signatures_of(loaded),
        "saved_model": {"path": serving_dir, "size_bytes": folder_bytes(serving_dir),
                        "latency_ms": tflite.saved_model_latency_ms(raw, one, config.latency_runs)},
        "metrics": metrics,
        "exported": exported or {},
        # column -> name in the signatures (serving.signature_names.signature_name)
        "signature_names": signature_names_of([*kinds, *(h.label_column for h in heads)]),
        "tflite": [],
    }
    representative = None
    if "int8" in config.tflite_variants:
        representative = _parsed_numpy(read_examples(train_pattern, config.representative_examples), kinds)
    tf.io.gfile.makedirs(os.path.join(artifact_dir, TFLITE_DIR))
    results, unconvertible = [], set()
    for variant, content in tflite.convert_each(serving_dir, config.tflite_variants, representative, loaded).items():
        if isinstance(content, Exception):
            results.append(tflite.VariantReport(variant, None, 0, problems=[tflite.conversion_problem(content)]))
            unconvertible.add(variant)
            continue
        path = os.path.join(artifact_dir, TFLITE_DIR, f"model_{variant}.tflite")
        write_file(path, content)
        result = tflite.check_variant(variant, content, reference, features, labels, heads,
                                      config.output_tolerance[variant], config.metric_tolerance[variant], path)
        if result.passed:
            result.latency_ms = tflite.tflite_latency_ms(content, one, config.latency_runs)
        log.info("tflite %s: %d bytes, max abs diff %s, %s", variant, result.size_bytes, result.max_abs_diff,
                 "parity ok" if result.passed else "; ".join(result.problems))
        results.append(result)
    # A Transform graph's ops may be beyond TFLite's builtins: such a model's unconvertible
    # variants are dropped, required or not; its converted ones pass the gate as any model's.
    excused = unconvertible if transform is not None else set()
    required = [r for r in results if not r.passed and r.variant in set(config.required_variants) - excused]
    for result in results:
        if not result.passed and result not in required:
            _drop(result)
    report["tflite"] = [r.to_json() for r in results]
    write_report(artifact_dir, report)
    if required:
        raise tflite.ParityError(required)
    return report


def _export_without_heads(model: keras.Model, metrics: dict[str, float], serving_dir: str, artifact_dir: str,
                          config: ExportConfig) -> dict:
    """A model without heads served as itself, with a warmup request (zeros of its inputs' shapes)
    and the report. Its inputs are not the data's, so a TFLite variant has no examples to pass
    the parity gate on: asking for one is refused."""
    if config.tflite_variants:
        raise ValueError(f"export.tflite_variants={config.tflite_variants}: the exported model '{model.name}' has no "
                         "heads, so it is served on its own inputs, not the data's examples, and TFLite parity cannot be "
                         "checked for it; set export.tflite_variants: [] (a resumed run exports from the last checkpoint)")
    export_as_itself(model, serving_dir)
    one = {name: tf.zeros([1, *(d or 1 for d in spec.shape[1:])], spec.dtype).numpy()
           for name, spec in own_input_spec(model).items()}
    write_logs(serving_dir, [predict_log(names.DEFAULT, one)])
    loaded = tf.saved_model.load(serving_dir)
    report = {
        "signatures": signatures_of(loaded),
        "saved_model": {"path": serving_dir, "size_bytes": folder_bytes(serving_dir),
                        "latency_ms": tflite.saved_model_latency_ms(loaded.signatures[names.DEFAULT], one,
                                                                    config.latency_runs)},
        "metrics": metrics,
        "tflite": [],
    }
    write_report(artifact_dir, report)
    return report


def _drop(result: tflite.VariantReport) -> None:
    """A variant that missed parity and is not required: served nowhere, so its file goes."""
    if result.path and tf.io.gfile.exists(result.path):
        tf.io.gfile.remove(result.path)
    result.dropped = True
    log.warning("tflite %s dropped: %s", result.variant, "; ".join(result.problems))


def dropped_variants(report: dict) -> dict[str, str]:
    """{variant: why} for the variants an export report says were dropped."""
    return {v["variant"]: "; ".join(v["problems"]) for v in report.get("tflite", []) if v.get("dropped")}


def write_report(folder: str, report: dict, blessing: dict | None = None) -> None:
    """`export_report.json` and a short `export_report.md` (plus the blessing when known)."""
    if blessing is not None:
        report = {**report, "blessing": blessing}
    write_file(os.path.join(folder, REPORT_JSON), json.dumps(report, indent=2, default=str) + "\n")
    write_file(os.path.join(folder, REPORT_MD), report_markdown(report))


def report_markdown(report: dict) -> str:
    lines = ["# Export report", "", "## Signatures", ""]
    for name, sig in report["signatures"].items():
        ins = ", ".join(f"`{k}` {v['dtype']}{v['shape']}" for k, v in sig["inputs"].items())
        outs = ", ".join(f"`{k}` {v['dtype']}" for k, v in sig["outputs"].items())
        lines.append(f"- `{name}`: {ins} -> {outs}")
    saved = report["saved_model"]
    lines += ["", "## Sizes, parity and latency (one example)", "",
              "| model | size | max abs diff | metric delta | latency ms | parity |", "|---|---|---|---|---|---|",
              f"| SavedModel | {saved['size_bytes']:,} B | | | {_ms(saved['latency_ms'])} | reference |"]
    for v in report["tflite"]:
        diff = ", ".join(f"{k} {x:.2g}" for k, x in v["max_abs_diff"].items())
        delta = ", ".join(f"{k} {x:.2g}" for k, x in v["metric_delta"].items())
        lines.append(f"| TFLite {v['variant']} | {v['size_bytes']:,} B | {diff} | {delta} | {_ms(v['latency_ms'])} | "
                     f"{_parity_cell(v)} |")
    exported = report.get("exported")
    if exported:
        lines += ["", "## Weights exported", "", f"- {exported_weights(exported)}"]
    lines += ["", "## Eval metrics", ""]
    lines += [f"- {k}: {v:.4g}" for k, v in sorted(report["metrics"].items())]
    blessing = report.get("blessing")
    if blessing is not None:
        lines += ["", "## Blessing", "", f"**{'blessed' if blessing['blessed'] else 'not blessed'}**", ""]
        lines += [f"- {r}" for r in blessing["reasons"]]
    return "\n".join(lines) + "\n"


def exported_weights(exported: dict) -> str:
    """TrainResult.exported in words, e.g. "epoch 3, step 24: the best validation species_loss (0.1234)"."""
    where = f"epoch {exported['epoch']}, step {exported['step']}"
    if exported.get("restored"):
        return f"{where}: the best {exported['split']} {exported['metric']} ({exported['value']:.4g})"
    if exported.get("metric"):
        return f"{where}: the last weights (not selected by {exported['split']} {exported['metric']})"
    return f"{where}: the last weights"


def _ms(latency: float | None) -> str:
    return f"{latency:.3f}" if latency is not None else "-"


def _parity_cell(variant: dict) -> str:
    if variant["passed"]:
        return "ok"
    return ("DROPPED: " if variant.get("dropped") else "FAILED: ") + "; ".join(variant["problems"])
