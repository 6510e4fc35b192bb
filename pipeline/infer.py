"""`loopline infer DATA --output FILE [--version N]`: batch inference (TFX's BulkInferrer, outside a
pipeline) with the served champion (the version behind the champion alias's TF Serving label,
else the newest pushed) or a given version, through the server's own signature code
(serving.signature_call: the Session callable of the `predict` signature, on tf.Examples), in
batches streamed from DATA to FILE so memory holds a few batches whatever DATA's size.

DATA is read as `data.format` says (CSV, TFRecord, Parquet, an image folder; a file or a glob).
FILE (.parquet or .csv, local or in a bucket) holds DATA's columns (an image folder's: the file's
path and its class folder) and per head `predicted_<head>` (the class, or the value) and, for a
classification head, `predicted_<head>_score_<class>` per class. It is written under a temporary
name and renamed when complete. The run is recorded in MLflow (`loopline.kind=infer`).
"""
from __future__ import annotations

import functools
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from ingestion.csv_options import CsvOptions
from pipeline.config import LooplineConfig
from serving import signature_names as names
from serving.model_config import labelled_or_latest_version
from serving.signature_call import signature_caller
from trainer.arrow_io import GFileStream
from trainer.evaluation import evaluation_signature, read_description
from trainer.heads import CLASSIFICATION, Head

PREFIX = "predicted_"


@dataclass
class InferResult:
    output: str
    version: int
    examples: int
    seconds: float
    run_id: str | None = None

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0


def served_version(config: LooplineConfig, version: int | None) -> tuple[str, int]:
    """(SavedModel folder, version): `version`, else the champion as the Evaluator finds it."""
    serving_root = os.path.join(config.pipeline.root, "serving")
    model = config.serving.model_name
    if version is not None:
        path = os.path.join(serving_root, model, str(version))
        if not tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
            raise FileNotFoundError(f"no version {version} of model {model} under {serving_root}")
        return path, version
    path = labelled_or_latest_version(serving_root, model, config.mlflow.alias_labels.get("champion", ""))
    if path is None:
        raise FileNotFoundError(f"nothing pushed for model {model} under {serving_root}; run the pipeline first")
    return path, int(os.path.basename(path))


def data_files(pattern: str, data_format: str) -> list[str]:
    if data_format == "image_folder":
        files = [f for f in tf.io.gfile.glob(os.path.join(pattern, "*", "*"))]
    else:
        files = tf.io.gfile.glob(pattern)
    if not files:
        raise FileNotFoundError(f"no {data_format} data at {pattern}")
    return sorted(files)


# -- reading: per batch, the input's columns, the same rows as serialized tf.Examples, and where the
# batch's i-th example is in the data (for an error about it) ---------------------------------------
Batch = tuple[pa.Table, list[bytes], Callable[[int], str]]


def _csv_line(path: str, options: CsvOptions, first: int, index: int) -> str:
    """Where the `index`-th row after the file's `first` rows is: read for an error only."""
    from ingestion.csv_records import line_of

    return f"{path}: line {line_of(path, options, first + index + 2)}"  # row 1: the header


def _csv_batches(path: str, kinds: dict[str, str], batch_size: int, options: CsvOptions) -> Iterator[Batch]:
    """The CSV's cells as read (strings, null when missing), encoded by the model's feature kinds
    with the pipeline's CSV rules (ingestion.csv_records and data.na_values / delimiter /
    encoding): a cell that is not its kind's number is an error naming the line and the column."""
    from ingestion import csv_records
    from tfx_bsl.coders.csv_decoder import ColumnType

    types = {"int64": ColumnType.INT, "float32": ColumnType.FLOAT}
    header, options = csv_records.read_header(path, options)
    features = [c for c in header if c in kinds]
    wanted = {c: types.get(kinds[c], ColumnType.STRING) for c in features}
    rows = 0
    for block in csv_records.read_batches(path, header, options):
        for start in range(0, block.num_rows, batch_size):
            batch = block.slice(start, batch_size)
            selected = pa.RecordBatch.from_arrays([batch.column(c) for c in features], names=features)
            try:
                encoded = csv_records.encode(selected, wanted)
            except (pa.ArrowInvalid, ValueError) as exc:
                model_columns = ", ".join(f"{c}: {kinds[c]}" for c in features)
                bad = _first_bad_cell(selected, wanted)
                if bad is None:
                    raise ValueError(f"{path}: a column does not hold the model's types ({model_columns}): {exc}") from None
                index, column, cell = bad
                raise ValueError(f"{_csv_line(path, options, rows, index)}: {cell!r} in column '{column}' is not the "
                                 f"model's {kinds[column]} (the model's columns: {model_columns})") from None
            yield pa.Table.from_batches([batch]), encoded.to_pylist(), functools.partial(_csv_line, path, options, rows)
            rows += batch.num_rows


def _first_bad_cell(batch: pa.RecordBatch, wanted: dict) -> tuple[int, str, str] | None:
    """(row in the batch, column, cell) of the first cell that is not its column's number type;
    cell by cell, only once the batch is known to hold one."""
    from ingestion.csv_records import column_type

    found = [(index, name, cell) for name, kind in wanted.items()
             for index, cell in enumerate(batch.column(name).to_pylist())
             if cell is not None and column_type(pa.array([cell], pa.large_string())) > kind]
    return min(found, default=None)


def _scalar_columns(batch: pa.RecordBatch) -> pa.Table:
    """Decoded tf.Examples as columns: a feature with at most one value per example becomes a
    plain column (null when missing), others stay lists; bytes become text where they are UTF-8."""
    columns = []
    for column in batch.columns:
        if pa.types.is_null(column.type):  # a feature no example gives a value of any kind
            columns.append(column)
            continue
        lengths = np.asarray(pc.list_value_length(column).fill_null(0))
        if lengths.size and lengths.max() <= 1:
            starts = np.asarray(column.offsets)[:-1]
            column = pc.take(column.values, pa.array(np.where(lengths == 1, starts, 0), mask=lengths != 1))
        if pa.types.is_large_binary(column.type) or pa.types.is_binary(column.type):
            try:
                column = column.cast(pa.large_string())
            except pa.ArrowInvalid:
                pass  # not text (e.g. encoded images): kept as bytes
        columns.append(column)
    return pa.Table.from_arrays(columns, names=batch.schema.names)


def _tfrecord_batches(path: str, batch_size: int) -> Iterator[Batch]:
    """By the pipeline's TFRecord reader: a damaged record is an error naming it."""
    from tfx_bsl.coders import example_coder

    from ingestion.file_records import tfrecord_records

    decoder = example_coder.ExamplesToRecordBatchDecoder()
    first = 1
    for records in tfrecord_records(path, batch_size):
        yield _scalar_columns(decoder.DecodeBatch(records)), records, lambda i, first=first: f"{path}: record {first + i}"
        first += len(records)


def _parquet_batches(path: str) -> Iterator[Batch]:
    """Row group by row group, as the pipeline's Parquet reader encodes them."""
    from apache_beam.io.filesystems import FileSystems

    from ingestion.file_records import open_parquet, parquet_records

    with FileSystems.open(path) as f:
        reader = open_parquet(path, f)
        groups = (reader.read_row_group(g) for g in range(reader.num_row_groups))
        first = 1
        for table, records in zip((t for t in groups if t.num_rows), parquet_records(path)):
            yield table, records, lambda i, first=first: f"{path}: row {first + i}"
            first += len(records)


def _image_batches(files: list[str], batch_size: int) -> Iterator[Batch]:
    from ingestion.file_records import LABEL_FEATURE, image_record

    for start in range(0, len(files), batch_size):
        chunk = files[start:start + batch_size]
        table = pa.table({"path": chunk, LABEL_FEATURE: [os.path.basename(os.path.dirname(p)) for p in chunk]})
        yield table, [image_record(p)[0] for p in chunk], chunk.__getitem__


def read_data(pattern: str, data_format: str, kinds: dict[str, str], batch_size: int,
              csv_options: CsvOptions | None = None) -> Iterator[Batch]:
    files = data_files(pattern, data_format)
    if data_format == "image_folder":
        yield from _image_batches(files, batch_size)
        return
    for path in files:
        if data_format == "csv":
            yield from _csv_batches(path, kinds, batch_size, csv_options or CsvOptions())
        elif data_format == "tfrecord":
            yield from _tfrecord_batches(path, batch_size)
        elif data_format == "parquet":
            yield from _parquet_batches(path)
        else:
            raise ValueError(f"data.format {data_format!r} cannot be read by loopline infer")


# -- predicting and writing ------------------------------------------------------------------------
def prediction_columns(outputs: dict[str, np.ndarray], keys: dict[str, str], heads: list[Head], rows: int) -> dict[str, pa.Array]:
    columns = {}
    for head in heads:
        values = np.asarray(outputs[keys[head.name]], np.float32).reshape(rows, -1)
        if head.kind == CLASSIFICATION:
            vocabulary = np.array(head.vocabulary, dtype=object)
            columns[f"{PREFIX}{head.name}"] = pa.array(vocabulary[values.argmax(axis=1)], pa.large_string())
            for j, label in enumerate(head.vocabulary):
                columns[f"{PREFIX}{head.name}_score_{label}"] = pa.array(values[:, j])
        else:
            columns[f"{PREFIX}{head.name}"] = pa.array(values[:, 0])
    return columns


class OutputWriter:
    """Parquet or CSV by the output's suffix, one schema for the whole file (the first batch's)."""

    def __init__(self, path: str):
        lower = path.lower()
        if not lower.endswith((".parquet", ".csv")):
            raise ValueError(f"--output {path}: give a .parquet or .csv file")
        self.path, self.csv = path, lower.endswith(".csv")
        folder = os.path.dirname(path)
        if folder:
            tf.io.gfile.makedirs(folder)
        self.staged = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}")
        self._sink = GFileStream(self.staged, "wb")
        self._writer = None

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            import pyarrow.csv as pacsv
            import pyarrow.parquet as pq

            self._writer = pacsv.CSVWriter(self._sink, table.schema) if self.csv else pq.ParquetWriter(self._sink, table.schema)
        elif table.schema != self._writer.schema:
            table = _conform(table, self._writer.schema)
        self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._sink.close()
        tf.io.gfile.rename(self.staged, self.path, overwrite=True)

    def abort(self) -> None:
        self._sink.close()
        if tf.io.gfile.exists(self.staged):
            tf.io.gfile.remove(self.staged)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A later batch in the first batch's columns: a column it lacks is null, types cast."""
    arrays = []
    for field in schema:
        if field.name in table.column_names:
            arrays.append(table[field.name].cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def infer(config: LooplineConfig, data: str, output: str, version: int | None = None, data_format: str | None = None,
          batch_size: int = 4096, progress: bool = True) -> InferResult:
    from tqdm import tqdm

    path, version = served_version(config, version)
    description = read_description(path)
    heads = [Head.from_json(h) for h in description["heads"]]
    signature, keys = evaluation_signature(description.get("layout", 1), heads)
    clashes = [c for c in prediction_columns_names(heads) if c in (description.get("features") or {})]
    if clashes:
        raise ValueError(f"the model has features named like its prediction columns: {clashes}")
    started, rows = time.perf_counter(), 0
    writer = OutputWriter(output)
    try:
        with signature_caller(path, signature) as call, \
                tqdm(unit=" examples", file=sys.stderr, disable=not progress, desc=f"infer v{version}") as bar:
            for table, records, where in read_data(data, data_format or config.data.format, description["features"],
                                                      batch_size, config.data.csv_options()):
                outputs = _predict(call, records, where)
                writer.write(_with_predictions(table, prediction_columns(outputs, keys, heads, len(records))))
                rows += len(records)
                bar.update(len(records))
    except BaseException:
        writer.abort()
        raise
    writer.close()
    result = InferResult(output, version, rows, time.perf_counter() - started)
    result.run_id = record_in_mlflow(config, result, data, data_format or config.data.format, batch_size)
    return result


def _predict(call, records: list[bytes], where: Callable[[int], str]) -> dict[str, np.ndarray]:
    """The signature's outputs for a batch. An example the model refuses (a value of another kind,
    more values than its feature holds, an image that does not decode) is an error naming where it
    is in the data: once the batch is refused, its examples are tried one by one to find it."""
    from ingestion.op_errors import op_message

    try:
        return call({names.INPUTS: np.array(records, dtype=object)})
    except tf.errors.InvalidArgumentError as exc:
        refused = exc
    for index, record in enumerate(records):
        try:
            call({names.INPUTS: np.array([record], dtype=object)})
        except tf.errors.InvalidArgumentError as exc:
            raise ValueError(f"{where(index)}: the model cannot take this example: {op_message(exc)}") from None
    raise refused


def _with_predictions(table: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    """The input's columns, then the predictions' (examples without any feature have no columns)."""
    if not table.num_columns:
        return pa.table(columns)
    for name, column in columns.items():
        table = table.append_column(name, column)
    return table


def prediction_columns_names(heads: list[Head]) -> list[str]:
    return [f"{PREFIX}{h.name}" for h in heads] + [f"{PREFIX}{h.name}_score_{c}" for h in heads
                                                     if h.kind == CLASSIFICATION for c in h.vocabulary]


def record_in_mlflow(config: LooplineConfig, result: InferResult, data: str, data_format: str, batch_size: int) -> str | None:
    """One MLflow run for the inference, linked to the run of the model it used. Returns its id;
    None when mlflow.enabled is off."""
    from pipeline.tracking_setup import registered_model_name, tracking_target

    target = tracking_target(config)
    if target is None:
        return None
    from tracking.registration import TAG_SERVING_VERSION
    from tracking.served_runs import TAG_KIND, TAG_MODEL_RUN, run_of_serving_version
    from tracking.target import ensure_experiment, make_client

    client = make_client(target)
    model_run, registered = run_of_serving_version(client, registered_model_name(config), result.version)
    tags = {TAG_KIND: "infer", TAG_SERVING_VERSION: str(result.version), TAG_MODEL_RUN: model_run or "",
            "loopline.registered_version": registered or ""}
    run = client.create_run(ensure_experiment(client, target), tags=tags,
                            run_name=f"infer {config.serving.model_name} v{result.version}")
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    params = {"data": data, "data_format": data_format, "output": result.output, "batch_size": batch_size,
              "version": result.version}
    metrics = {"examples": result.examples, "seconds": result.seconds, "examples_per_second": result.examples_per_second}
    client.log_batch(run.info.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                     params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    client.set_terminated(run.info.run_id)
    return run.info.run_id
