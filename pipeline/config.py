"""Reads loopline's one YAML configuration, applies `--set key=value` overrides and validates it.

Every section is a pydantic model with unknown keys forbidden, so a typo fails before any work
with the dotted key named. Relative paths are relative to the configuration file's folder.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ingestion.csv_options import PANDAS_NA_VALUES, CsvOptions, Delimiter, check_encoding
from serving.config import ServingConfig
from trainer.config import TrainerConfig
from trainer.evaluator_config import EvaluatorConfig
from trainer.export_config import ExportConfig
from trainer.tuning import TunerConfig
from validation.config import ValidationConfig


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


def is_remote(path: str) -> bool:
    """A URI of a filesystem tf.io.gfile and Beam open (gs://...), not a path on this machine."""
    return "://" in path


# Filesystems TensorFlow 2.21 and Beam both open without extra packages. `ram://` is TensorFlow's
# in-memory filesystem: one process only, for tests (Beam needs a FileSystem registered for it).
SUPPORTED_SCHEMES = ("gs", "ram")
# s3:// and hdfs:// need tensorflow-io, whose newest release (0.37.1) does not load with TF 2.21.
_NEEDS_TENSORFLOW_IO = ("s3", "hdfs", "viewfs", "har")


def check_scheme(key: str, value: str) -> None:
    """Raises ConfigError when `value` is a URI on a filesystem loopline cannot read."""
    scheme = value.split("://", 1)[0]
    if not is_remote(value) or scheme in SUPPORTED_SCHEMES:
        return
    why = ("TensorFlow 2.21 reads it only through tensorflow-io, whose newest release (0.37.1) does not load "
           "with TensorFlow 2.21" if scheme in _NEEDS_TENSORFLOW_IO else "TensorFlow cannot open it")
    raise ConfigError(f"{key}: {value!r}: the {scheme}:// filesystem is not supported ({why}); "
                      "use gs://... or a path on a volume")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PipelineSection(_Section):
    name: str = Field("penguins", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", description="The TFX pipeline's name.")
    root: str = Field(
        "workspace", description="Artifacts (`tfx/`), the serving folder (`serving/`), the data baseline (`baseline/`), "
        "logs (`logs/`) and ML Metadata (`metadata.sqlite`) when local; a folder or `gs://...`.")
    metadata_path: str | None = Field(
        None, description="ML Metadata's SQLite file (always local: SQLite needs one). null: "
        "`<pipeline.root>/metadata.sqlite`; required when pipeline.root is remote.")
    enable_cache: bool = Field(True, description="Reuse the outputs of components whose inputs and settings are unchanged.")
    beam_args: list[Annotated[str, Field(pattern=r"^--[A-Za-z]")]] = Field(
        [], description="Apache Beam options for ExampleGen, StatisticsGen, Pusher and the other Beam-based components, "
        "e.g. [\"--direct_running_mode=multi_processing\", \"--direct_num_workers=0\"] or a Flink, Spark or Dataflow "
        "runner's flags. Without a `--runner`: Beam's FnApiRunner in process (the DirectRunner's own, without its "
        "attempt at the Prism runner, which downloads a binary).")
    lock_wait_seconds: float = Field(
        600, ge=0, description="How long `loopline run` and `loopline data accept` wait for another run holding the "
        "lock on the same ML Metadata file (`<metadata file>.lock`) before stopping with one line naming it; "
        "0: do not wait.")
    keep_logs: int = Field(
        20, ge=1, description="Logs kept under `<root>/logs` for each command (run, train, serve, predict, "
        "data-report, data-accept); a command that ends removes its older ones.")


# `data.schema` shadows pydantic's deprecated `BaseModel.schema()`, which nothing here uses.
warnings.filterwarnings("ignore", message='Field name "schema" in "DataSection" shadows')


class DataSection(_Section):
    format: Literal["csv", "tfrecord", "parquet", "image_folder"] = Field(
        "csv", description="csv: CSV files; tfrecord: tf.Example TFRecords, split as TFX's ImportExampleGen splits them (GZIP "
        "from a `.gz` suffix); parquet: Parquet files; image_folder: a folder of class folders of images.")
    path: str = Field(
        "data/penguins.csv", description="The data to train on, as data.format says: a CSV file (header row) or a glob "
        "of CSV files with the same header, a TFRecord or Parquet file or glob, or an image folder.")
    label: str = Field("species", description="The label column (`label` for an image folder).")
    label_kind: Literal["auto", "classification", "regression"] = Field(
        "auto", description="auto: strings classification, numbers regression; classification also takes whole "
        "numbers. A model module's declared kinds win; a contradiction is an error.")
    max_classes: int | None = Field(
        None, ge=2, description="Keep only the N most frequent classes (the other rows are counted and logged, and left "
        "out of loss and accuracy); null: every class.")
    schema: str | None = Field(
        None, description="A curated tensorflow-metadata Schema (text format); null: the data baseline's schema, "
        "else (the first run on a root) inferred from this run's train split.")
    eval_path: str | None = Field(
        None, description="The eval split, the same kind of thing as data.path (a CSV, a file or glob, an image folder); "
        "null: data.path is split 2:1.")
    example_gen: Literal["arrow", "stock"] = Field(
        "arrow", description="The CSV reader: arrow (Arrow record batches written as tf.Examples a column at a time by "
        "tfx-bsl's C++ encoder) or stock (TFX's CsvExampleGen, per-line Python). Both write the same artifact.")
    na_values: list[str] | None = Field(
        None, description="CSV cells read as missing, in every column (the whole cell, quoted or not); replaces "
                          "pandas' default list, which null keeps: '', 'NA', 'N/A', 'n/a', 'NaN', 'nan', 'null', "
                          "'NULL', 'None', '#N/A', '<NA>' and more. Keep '' in the list for empty cells to stay "
                          "missing; [''] is the stock CsvExampleGen's rule.")
    delimiter: Delimiter = Field(",", description="The CSV delimiter: ',', ';', a tab (\"\\t\" in YAML), '|', or auto "
                                                   "(chosen from each file's first lines among those).")
    encoding: str = Field("utf-8", description="The CSV files' text encoding, a Python codec name (utf-8, latin-1, "
                                               "cp1252, utf-16...); bytes it cannot decode stop the run with the line.")

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        return check_encoding(value)

    def csv_options(self) -> CsvOptions:
        """How the CSV readers (ExampleGen, `loopline train`, the header checks) read data.path."""
        na_values = PANDAS_NA_VALUES if self.na_values is None else tuple(self.na_values)
        return CsvOptions(na_values, self.delimiter, self.encoding)


class MlflowSection(_Section):
    enabled: bool = Field(True, description="Track runs and register models in MLflow (a Registrar component).")
    tracking_uri: str | None = Field(
        None, description="An MLflow server's URL; null: an embedded store, SQLite and local artifacts in "
        "`<pipeline.root>/mlflow` (a server URL is required when pipeline.root is remote).")
    experiment: str = Field("loopline", description="The MLflow experiment of the runs.")
    registered_model: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="The registered model's name; null: serving.model_name.")
    alias_labels: dict[str, str] = Field(
        {"champion": "stable", "challenger": "canary"}, description="MLflow alias -> TF Serving version label: "
        "`loopline promote --alias A` points the label alias_labels[A] at the promoted version.")
    flush_interval_s: float = Field(2.0, ge=0, description="Seconds between metric batches sent (0: send at every log).")
    close_timeout_s: float = Field(
        30.0, ge=0, description="How long the end of training waits for unsent metrics before saving them to a file.")
    http_retries: int = Field(2, ge=0, description="Retries per MLflow HTTP request (MLflow's own default waits minutes).")
    http_timeout_s: float = Field(
        20.0, gt=0, description="Seconds an MLflow HTTP request may take (MLflow's own default blocks for minutes when "
        "the server is down).")


class TransformSection(_Section):
    module_file: str | None = Field(
        None, description="A TFX module file with `preprocessing_fn(inputs)` (tf.Transform): a Transform step after "
        "SchemaGen analyzes it over the train split and applies it to every split (TFX's Transform artifacts: "
        "`transform_graph`, `transformed_examples`). A run_fn trains on its output; so does loopline's own "
        "model, whose signatures then take the raw columns and run the transform graph first (labels pass "
        "through unchanged); null: no Transform step.")


class LooplineConfig(_Section):
    pipeline: PipelineSection = Field(PipelineSection(), description="The TFX pipeline: its name, where it writes, "
                                      "ML Metadata, caching, Beam.")
    data: DataSection = Field(DataSection(), description="The data to train on and how it is read.")
    trainer: TrainerConfig = Field(TrainerConfig(), description="The custom-loop trainer: the model, the step's "
                                   "controls, checkpoints, evaluation, summaries.")
    transform: TransformSection = Field(TransformSection(), description="TFX's Transform step: a module file's "
                                        "preprocessing_fn over the data (off by default).")
    tuner: TunerConfig = Field(TunerConfig(), description="A Tuner step before the Trainer: a TFX module's tuner_fn, "
                               "or a search over loopline's own model's keys (off by default).")
    serving: ServingConfig = Field(ServingConfig(), description="The served model and the embedded TF-Serving-compatible "
                                   "server (`loopline serve`).")
    export: ExportConfig = Field(ExportConfig(), description="What the Trainer writes besides the SavedModel: TFLite "
                                 "variants and their parity gate, the warmup file.")
    evaluator: EvaluatorConfig = Field(EvaluatorConfig(), description="When a candidate model is blessed (and so pushed).")
    mlflow: MlflowSection = Field(MlflowSection(), description="MLflow tracking, the model registry and promotion.")
    validation: ValidationConfig = Field(ValidationConfig(), description="Data validation: within a run, and against "
                                         "the baseline of the last pushed run.")

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def flat(self) -> dict[str, Any]:
        """The resolved config as dotted keys (for logging as parameters)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for key, sub in value.items():
                    walk(f"{prefix}.{key}" if prefix else key, sub)
            else:
                out[prefix] = value

        walk("", self.as_dict())
        return out


# Keys holding paths, resolved against the config file's folder.
_PATH_KEYS = (("pipeline", "root"), ("pipeline", "metadata_path"), ("data", "path"), ("trainer", "module_file"), ("data", "schema"),
              ("data", "eval_path"), ("transform", "module_file"), ("tuner", "module_file"), ("serving", "tls_cert"), ("serving", "tls_key"))


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Applies one `dotted.key=value` to the raw mapping; the value is parsed as YAML."""
    key, sep, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not all(parts):  # no '=', or an empty key or part ('.x', 'a..b')
        raise ConfigError(f"--set {override!r}: expected dotted.key=value")
    shown = key if key.isprintable() else repr(key)  # a line end in the key would break the message's line
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {shown}: {'.'.join(parts[: i + 1])!r} is not a section")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {shown}: the value {text!r} is not YAML ({_yaml_problem(exc)})") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What YAML refused, on one line, with the line and column where it is known."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    if isinstance(exc, yaml.reader.ReaderError):  # bytes that are not text in the file's encoding
        return f"byte {exc.position}: {problem}"
    return problem


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(p) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {key!r}"
    return f"{key!r}: {error['msg']} (got {error.get('input')!r})"


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> LooplineConfig:
    """Loads, overrides, validates and resolves the configuration. Raises ConfigError."""
    raw: dict[str, Any] = {}
    base = Path.cwd()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_bytes())  # YAML reads the encoding from a byte-order mark
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        raw = loaded or {}
        base = path.resolve().parent
    for override in overrides:
        apply_override(raw, override)
    try:
        config = LooplineConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors())
        where = f"{path}: " if path is not None else ""
        raise ConfigError(f"{where}invalid configuration: {problems}") from None
    for section, key in _PATH_KEYS:
        holder = getattr(config, section)
        value = getattr(holder, key)
        if value is not None and not is_remote(value):
            setattr(holder, key, str((base / value).resolve()))
        elif value is not None:
            check_scheme(f"{section}.{key}", value)
    return config
