"""Users' files and config values, damaged at random (hypothesis, a fixed seed): each is read, or
refused with one line that names the file and the line, record or key. The fuzzers call what
`loopline run` and `loopline infer` call on each input, in process; a few bad inputs of each kind
then go through the real commands, which must exit non-zero with that line, no traceback, and
nothing half-written in the serving folder, the registry or infer's output.

LOOPLINE_FUZZ_EXAMPLES=N runs N examples per fuzzer instead of the few hundred here (`make fuzz`).
"""
from __future__ import annotations

import codecs
import glob
import gzip
import io
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingestion import csv_records
from ingestion.csv_options import CsvError
from ingestion.file_records import FormatError, image_record, tfrecord_records
from pipeline.checks import check_data
from pipeline.config import ConfigError, LooplineConfig, load_config
from tests.conftest import REPO, subprocess_env

FUZZ_EXAMPLES = int(os.environ.get("LOOPLINE_FUZZ_EXAMPLES", "0"))


def fuzzed(examples: int):
    """A fixed seed and `examples` cases (LOOPLINE_FUZZ_EXAMPLES instead, when set); tmp_path is
    shared by a test's cases, each writes its own file over the last."""
    return settings(derandomize=True, database=None, deadline=None, max_examples=FUZZ_EXAMPLES or examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


def assert_clear(error: Exception, *names: str) -> None:
    """One line, naming each of `names` (the file, where in it)."""
    message = str(error)
    assert "\n" not in message and "Traceback" not in message, message
    for name in names:
        assert name in message, f"{name!r} not in {message!r}"


@pytest.fixture
def unraisable(monkeypatch) -> list:
    """Errors Python could only print (a callback's, as pyarrow's for a CSV row): none is allowed."""
    caught = []
    monkeypatch.setattr(sys, "unraisablehook", caught.append)
    return caught


# -- CSV ------------------------------------------------------------------------------------------
CSV = b"".join((REPO / "data" / "penguins.csv").read_bytes().splitlines(keepends=True)[:10])
SPLICES = [b'"', b"\x00", codecs.BOM_UTF8, codecs.BOM_UTF16_LE, b"\xe9", b"\xff\xfe\xfd", b"\r", b"\n", b",", b",,,",
           b'""', b'\n"unclosed', b"1e400", b"-inf", b"99999999999999999999", b"NA", b"abc", b"x" * 200_000,
           b"h" * 70_000 + b","]


@st.composite
def damaged_csv(draw) -> bytes:
    data = bytearray(CSV)
    for _ in range(draw(st.integers(1, 4))):
        damage = draw(st.sampled_from(["cut", "flip", "splice", "splice", "drop line", "label", "empty", "header only"]))
        at = draw(st.integers(0, len(data)))
        if damage == "cut":
            del data[at:]
        elif damage == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif damage == "splice":
            data[at:at] = draw(st.sampled_from(SPLICES))
        elif damage == "drop line":
            lines = data.splitlines(keepends=True)
            if lines:
                del lines[at % len(lines)]
            data = bytearray(b"".join(lines))
        elif damage == "label":  # the label column renamed or gone
            data = data.replace(b"species", draw(st.sampled_from([b"Species", b"", b"species,species", b"label"])), 1)
        elif damage == "empty":
            data = bytearray()
        elif damage == "header only":
            data = data[:data.find(b"\n") + 1]
    return bytes(data)


def csv_example_gen(path: Path, *overrides: str) -> int:
    """What `loopline run` does with a CSV up to the examples: the checks before the run, then
    the Arrow ExampleGen's steps on the file (header, the type pass, encoding, the split and the
    statistics summaries). Returns the number of rows."""
    from validation.statistics import summarize_batch

    config = load_config(REPO / "loopline.yaml", [f"data.path={path}", *overrides])
    check_data(config)
    names, options = csv_records.read_header(str(path), config.data.csv_options())
    types = csv_records.file_types(str(path), names, options)
    rows = 0
    for batch in csv_records.read_batches(str(path), names, options):
        records, columns = csv_records.encode_with_columns(batch, types)
        csv_records.split_records(records, [2, 3])
        summarize_batch(columns)
        rows += batch.num_rows
    return rows


@fuzzed(120)
@given(data=damaged_csv(), encoding=st.sampled_from(["utf-8", "latin-1", "utf-16"]),
       delimiter=st.sampled_from([",", "auto"]))
def test_csv_bytes_are_read_or_refused_naming_the_file(tmp_path, unraisable, data, encoding, delimiter):
    path = tmp_path / "data.csv"
    path.write_bytes(data)
    try:
        csv_example_gen(path, f"data.encoding={encoding}", f"data.delimiter='{delimiter}'")
    except (ConfigError, CsvError) as error:
        assert_clear(error, str(path))
    assert not unraisable


# Each input here once escaped as a traceback, printed one, or was read as something it is not.
CSV_FOUND = {
    # pyarrow decoded the ragged row's text as UTF-8 to hand it over, printed the failure, and the
    # line count after it failed on the same byte
    "ragged row with undecodable bytes": (CSV + b"46.5,,Dream\r\n\xe9,Chinstrap\n", [],
                                          r"line 11: 3 cells where the header has 8: '46.5,,Dream'"),
    # Python's csv module refuses cells over 128 KiB while it counts the lines to the bad row
    "cell over 128 KiB before a ragged row": (CSV.replace(b"Adelie", b"x" * 200_000, 1) + b"1,2\n", [],
                                              r"line 11: 2 cells where the header has 8: '1,2'"),
    "utf-16 without a byte-order mark": (CSV, ["data.encoding=utf-16"],
                                         r"not utf-16 text \(UTF-16 stream does not start with BOM\)"),
    # Arrow takes everything after an unclosed quote in the last column as one cell, silently
    "unclosed quote in the last column": (CSV + b'Adelie,Dream,1,2,3,4,male,"2009\n' + CSV[CSV.find(b"\n") + 1:],
                                          [], r"line 11: a quoted cell is not closed"),
    "header line longer than the sample": (b"h" * 70_000 + b",species\n1,x\n", [],
                                           r"the header line is longer than 64 KiB"),
}


@pytest.mark.parametrize("name", CSV_FOUND)
def test_found_csv_cases_are_one_line_errors(tmp_path, unraisable, name):
    data, overrides, expected = CSV_FOUND[name]
    path = tmp_path / "found.csv"
    path.write_bytes(data)
    with pytest.raises((CsvError, ConfigError), match=expected) as error:
        csv_example_gen(path, *overrides)
    assert_clear(error.value, str(path))
    assert not unraisable


# -- TFRecord -------------------------------------------------------------------------------------
def framed(record: bytes) -> bytes:
    """A TFRecord frame: the length, its masked CRC32C, the data, its masked CRC32C."""
    def masked(data: bytes) -> bytes:
        crc = google_crc32c.value(data)
        return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)

    length = struct.pack("<Q", len(record))
    return length + masked(length) + record + masked(record)


def example(**features) -> bytes:
    from tensorflow.core.example import example_pb2

    out = example_pb2.Example()
    for name, value in features.items():
        feature = out.features.feature[name]
        if isinstance(value, bytes):
            feature.bytes_list.value.append(value)
        elif isinstance(value, int):
            feature.int64_list.value.append(value)
        else:
            feature.float_list.value.append(value)
    return out.SerializeToString()


GOOD_RECORDS = [example(x=float(i), n=i, label=b"ab"[i % 2:][:1]) for i in range(8)]
ODD_RECORDS = [example(x=1.5), example(x=b"text", n=1, label=b"a"), example(n=2.5, label=b"b"), b"",
               b"\xff\xfe not a proto", example()]


@st.composite
def damaged_tfrecord(draw) -> bytes:
    records = list(GOOD_RECORDS)
    for _ in range(draw(st.integers(0, 2))):  # records that are odd inside a sound frame
        odd = draw(st.one_of(st.sampled_from(ODD_RECORDS), st.binary(max_size=30)))
        records.insert(draw(st.integers(0, len(records))), odd)
    data = b"".join(map(framed, records))
    if draw(st.booleans()):
        data = gzip.compress(data)
    data = bytearray(data)
    for _ in range(draw(st.integers(0, 2))):  # damage to the file's bytes
        at = draw(st.integers(0, len(data)))
        if draw(st.booleans()):
            del data[at:]
        elif at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)


@fuzzed(150)
@given(data=damaged_tfrecord())
def test_tfrecord_files_are_read_or_refused_naming_the_record(tmp_path, data):
    from validation.statistics import summarize

    path = tmp_path / ("data.tfrecord.gz" if data.startswith(b"\x1f\x8b") else "data.tfrecord")
    path.write_bytes(data)
    try:
        for batch in tfrecord_records(str(path), batch_size=4):
            summarize(batch)  # what StatisticsGen makes of the records ExampleGen wrote
    except FormatError as error:
        assert_clear(error, str(path), "record ")


TFRECORD_FOUND = {  # each stopped the run with Beam's or tfx-bsl's words, naming no file and no record
    "cut file": (b"".join(map(framed, GOOD_RECORDS))[:-7], r"record 8: the file ends inside the record"),
    "damaged length": (framed(GOOD_RECORDS[0]) + b"\x00" + framed(GOOD_RECORDS[1]),
                       r"record 2: the length's CRC does not match"),
    "bytes that are not a tf.Example": (b"".join(map(framed, [GOOD_RECORDS[0], b"\xff\xfe garbage"])),
                                        r"record 2: 10 bytes that are not a tf.Example"),
    "a feature's kind changes": (b"".join(map(framed, [*GOOD_RECORDS, example(x=b"text")])),
                                 r"record 9: feature 'x' holds bytes values, where the records before it hold float"),
}


@pytest.mark.parametrize("name", TFRECORD_FOUND)
def test_found_tfrecord_cases_are_one_line_errors(tmp_path, name):
    data, expected = TFRECORD_FOUND[name]
    path = tmp_path / "found.tfrecord"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=expected) as error:
        list(tfrecord_records(str(path)))
    assert_clear(error.value, str(path))


def test_tfrecord_reader_keeps_every_example_of_a_sound_file(tmp_path):
    """The checks refuse damage only: a sound GZIP file gives back each example, deterministically
    serialized (the bytes the split hashes)."""
    from tensorflow.core.example import example_pb2

    path = tmp_path / "sound.tfrecord.gz"
    path.write_bytes(gzip.compress(b"".join(map(framed, GOOD_RECORDS))))
    read = [r for batch in tfrecord_records(str(path), batch_size=3) for r in batch]
    assert read == [example_pb2.Example.FromString(r).SerializeToString(deterministic=True) for r in GOOD_RECORDS]


def test_tfrecord_example_gen_splits_as_import_example_gen(tmp_path):
    """The checking ExampleGen puts each example in the split TFX's ImportExampleGen puts it in
    (ImportExampleGen writes a feature map in hash order, so examples are compared parsed)."""
    import tensorflow as tf
    from tfx.components.example_gen import utils
    from tfx.components.example_gen.import_example_gen.executor import Executor as ImportExecutor
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from components.file_example_gen import _TFRecordExecutor

    (tmp_path / "in").mkdir()
    records = [example(z=float(i), a=i, m=b"m%d" % i, **{f"k{i % 5}": 0.5}) for i in range(300)]
    (tmp_path / "in" / "part.tfrecord.gz").write_bytes(gzip.compress(b"".join(map(framed, records))))
    input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern="*")])

    def splits(executor, out: str) -> dict[str, list[bytes]]:
        examples = standard_artifacts.Examples()
        examples.uri = str(tmp_path / out)
        executor().Do({}, {"examples": [examples]}, {
            "input_base": str(tmp_path / "in"), "input_config": proto_utils.proto_to_json(input_config),
            "output_config": proto_utils.proto_to_json(utils.make_default_output_config(input_config)),
            "output_data_format": example_gen_pb2.FORMAT_TF_EXAMPLE})
        return {split: sorted(tf.train.Example.FromString(r).SerializeToString(deterministic=True)
                              for r in tf.data.TFRecordDataset(glob.glob(f"{tmp_path / out}/Split-{split}/*"), "GZIP")
                              .as_numpy_iterator()) for split in ("train", "eval")}

    checked = splits(_TFRecordExecutor, "checked")
    assert checked == splits(ImportExecutor, "stock")
    assert len(checked["train"]) + len(checked["eval"]) == 300 and checked["eval"]


# -- images ---------------------------------------------------------------------------------------
def encoded(image_format: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray((np.arange(64).reshape(8, 8) * 3).astype(np.uint8)).save(out, image_format)
    return out.getvalue()


IMAGES = {suffix: encoded(name) for suffix, name in (("png", "PNG"), ("jpg", "JPEG"), ("gif", "GIF"), ("bmp", "BMP"))}


def bomb_png(width: int, height: int) -> bytes:
    """A PNG of a few hundred bytes whose header declares width x height."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(b"\x00" * (width + 1) * 16)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


@st.composite
def damaged_image(draw) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from(sorted(IMAGES)))
    data = bytearray(IMAGES[suffix])
    for _ in range(draw(st.integers(1, 3))):
        damage = draw(st.sampled_from(["cut", "flip", "size", "splice", "empty", "text", "bomb"]))
        at = draw(st.integers(0, len(data)))
        if damage == "cut":
            del data[at:]
        elif damage == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif damage == "size":  # where the headers keep width and height
            at = min(at, 30)
            data[at:at + 2] = draw(st.sampled_from([b"\xff\xff", b"\x00\x00", b"\x7f\xff"]))
        elif damage == "splice":
            data[at:at] = draw(st.binary(max_size=20))
        elif damage == "empty":
            data = bytearray()
        elif damage == "text":
            data = bytearray(b"name,value\n1,2\n")
        elif damage == "bomb":
            data = bytearray(bomb_png(draw(st.sampled_from([9000, 60000])), draw(st.sampled_from([9000, 60000]))))
    return suffix, bytes(data)


@fuzzed(150)
@given(image=damaged_image())
def test_image_files_are_read_or_refused_naming_the_file(tmp_path, image):
    suffix, data = image
    path = tmp_path / "class" / f"picture.{suffix}"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    try:
        image_record(str(path))  # what ExampleGen and infer do with each file of an image folder
    except FormatError as error:
        assert_clear(error, str(path))


IMAGE_FOUND = {  # the first two stopped the run inside the Trainer with TensorFlow's graph trace
    "cut PNG": (IMAGES["png"][:40], r"not a readable image: Invalid PNG"),
    "decompression bomb": (bomb_png(60000, 60000), r"declares 60000x60000 pixels, more than the 67,108,864"),
    "no bytes": (b"", r"not a PNG, JPEG, GIF or BMP image"),
    "text named .png": (b"just text\n", r"not a PNG, JPEG, GIF or BMP image"),
}


@pytest.mark.parametrize("name", IMAGE_FOUND)
def test_found_image_cases_are_one_line_errors(tmp_path, name):
    data, expected = IMAGE_FOUND[name]
    path = tmp_path / "cat" / "found.png"
    path.parent.mkdir()
    path.write_bytes(data)
    with pytest.raises(FormatError, match=expected) as error:
        image_record(str(path))
    assert_clear(error.value, str(path))


# -- infer: examples the model may refuse ---------------------------------------------------------
@pytest.fixture(scope="module")
def served_model(tmp_path_factory):
    """A small exported model (three tabular features and an 8x8 image), its description, and its
    `predict` signature as infer calls it."""
    from serving.signature_call import signature_caller
    from tests.serving_helpers import export_model
    from trainer.evaluation import evaluation_signature, read_description
    from trainer.heads import Head

    path = str(export_model(tmp_path_factory.mktemp("fuzz-infer") / "export", kinds={"image": "image[8,8,1]"}))
    description = read_description(path)
    heads = [Head.from_json(h) for h in description["heads"]]
    signature, keys = evaluation_signature(description.get("layout", 1), heads)
    with signature_caller(path, signature) as call:
        yield description["features"], heads, keys, call


FEATURE_VALUES = st.one_of(st.floats(allow_nan=True, width=32), st.integers(-2**63, 2**63 - 1),
                           st.sampled_from([b"Dream", b"", IMAGES["png"], IMAGES["gif"], IMAGES["png"][:40], bomb_png(9000, 9000)]))


@st.composite
def model_examples(draw) -> bytes:
    """An example with some of the model's features, each holding 0-2 values of any kind."""
    from tensorflow.core.example import example_pb2

    out = example_pb2.Example()
    for name in draw(st.lists(st.sampled_from(["bill_length_mm", "flipper_length_mm", "island", "image"]), unique=True)):
        values = draw(st.lists(FEATURE_VALUES, max_size=2))
        feature = out.features.feature[name]
        for value in values:  # a list holds one kind: the first value's
            kind = type(values[0])
            if kind is bytes and isinstance(value, bytes):
                feature.bytes_list.value.append(value)
            elif kind is int and isinstance(value, int):
                feature.int64_list.value.append(value)
            elif kind is float and isinstance(value, float):
                feature.float_list.value.append(value)
    return out.SerializeToString()


@fuzzed(80)
@given(records=st.lists(model_examples(), min_size=1, max_size=6))
def test_examples_are_predicted_or_refused_naming_the_record(tmp_path, served_model, records):
    """What `loopline infer` does with a TFRecord file: read it, call the model a batch at a time,
    add the predictions to the input's columns."""
    from pipeline.infer import _predict, _with_predictions, prediction_columns, read_data

    kinds, heads, keys, call = served_model
    path = tmp_path / "examples.tfrecord"
    path.write_bytes(b"".join(map(framed, records)))
    try:
        for table, batch, where in read_data(str(path), "tfrecord", kinds, batch_size=4):
            predictions = prediction_columns(_predict(call, batch, where), keys, heads, len(batch))
            assert _with_predictions(table, predictions).num_rows == len(batch)
    except ValueError as error:  # FormatError, or the model's refusal
        assert_clear(error, str(path), "record ")


def empty_feature(name: str) -> bytes:
    from tensorflow.core.example import example_pb2

    out = example_pb2.Example()
    out.features.feature[name].SetInParent()  # the feature, with no list of any kind
    return out.SerializeToString()


INFER_FOUND = {  # a traceback each (TensorFlow's, or Arrow's about the columns); None: predicted now
    "text where the model takes a number": ([example(bill_length_mm=b"long")],
                                            r"record 1: the model cannot take this example: .*Key: bill_length_mm"),
    "an image that does not decode": ([example(island=b"Dream"), example(image=IMAGES["png"][:40])],
                                      r"record 2: the model cannot take this example: Invalid PNG"),
    "examples without any feature": ([example(), example()], None),
    "a feature without a list of any kind": ([empty_feature("bill_length_mm")], None),
}


@pytest.mark.parametrize("name", INFER_FOUND)
def test_found_infer_cases_are_predicted_or_one_line_errors(tmp_path, served_model, name):
    from pipeline.infer import _predict, _with_predictions, prediction_columns, read_data

    records, expected = INFER_FOUND[name]
    kinds, heads, keys, call = served_model
    path = tmp_path / "found.tfrecord"
    path.write_bytes(b"".join(map(framed, records)))

    def predicted() -> int:
        rows = 0
        for table, batch, where in read_data(str(path), "tfrecord", kinds, batch_size=4):
            rows += _with_predictions(table, prediction_columns(_predict(call, batch, where), keys, heads, len(batch))).num_rows
        return rows

    if expected is None:
        assert predicted() == len(records)
        return
    with pytest.raises(ValueError, match=expected) as error:
        predicted()
    assert_clear(error.value, str(path))


# -- configuration --------------------------------------------------------------------------------
def config_keys(model: type, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields"):
            keys += config_keys(field.annotation, f"{prefix}{name}.")
    return keys


KEYS = config_keys(LooplineConfig)
VALUES = ["", "null", "-1", "0", "1e309", "-.inf", ".nan", "[1, 2]", "{a: 1}", "true", "x", "'", "[", "{", "\x00",
          "99999999999999999999999", ": :", "!!python/object:os.system", "&a [*a]", '"\\t"', "/no/such/file.csv",
          "s3://bucket/x", "ram://fuzz/none.csv", "tfrecord", "image_folder"]
CONFIG_FILES = ["[1, 2]", "3", "'x'", "data: [1]", "{", "pipeline: {root: [a]}", "data:\n  na_values: NA",
                "trainer:\n  epochs: many", "\tdata: 1", "data: {path: 1}\ndata: {path: 2}"]


@fuzzed(300)
@given(key=st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS).map(lambda k: k + ".deeper"),
                     st.text(max_size=8)),
       value=st.one_of(st.sampled_from(VALUES), st.text(max_size=8)),
       config_file=st.one_of(st.none(), st.sampled_from(CONFIG_FILES), st.binary(max_size=12)))
def test_config_values_are_taken_or_refused_naming_the_key(tmp_path, key, value, config_file):
    """`--set key=value` over a config file (or none): a ConfigError naming the key, or a config
    whose data the checks before a run accept or refuse in one line."""
    path = None
    if config_file is not None:
        path = tmp_path / "loopline.yaml"
        path.write_bytes(config_file if isinstance(config_file, bytes) else config_file.encode())
    try:
        config = load_config(path, [f"{key}={value}"])
    except ConfigError as error:
        assert_clear(error)
        key = f"{key}={value}".partition("=")[0].strip()  # the key as --set reads it
        # The key or the part of it that is wrong (an unknown section, a value the key takes for a
        # section), as written or escaped; or the file.
        parts = key.split(".")
        prefixes = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        names = [form for prefix in prefixes for form in (prefix, repr(prefix)[1:-1])] if key else ["--set"]
        names.append(str(path) if path else "")
        assert any(name and name in str(error) for name in names), (names, str(error))
        return
    try:
        check_data(config)
    except ConfigError as error:
        assert_clear(error, "data.")


CONFIG_FOUND = {  # each escaped as another error, or as several lines
    "YAML error in the file": ("{", [], r"not valid YAML: line 1, column 2: expected the node content"),
    "bytes that are not UTF-8 in the file": (b"data: \xff\xfe", [], r"not valid YAML: byte 6: "),
    "unknown key holding a line end": (None, ["a\nb=1"], r"unknown key 'a\\nb'"),
    "a --set value that is not YAML": (None, ["data.label=["], r"--set data.label: the value '\[' is not YAML \(line 1"),
    "a line end in a --set key": (None, ["0\n0=["], r"--set '0\\n0': the value '\[' is not YAML"),
    "a --set key with an empty part": (None, [".="], r"--set '\.=': expected dotted.key=value"),
}


@pytest.mark.parametrize("name", CONFIG_FOUND)
def test_found_config_cases_are_one_line_errors(tmp_path, name):
    text, overrides, expected = CONFIG_FOUND[name]
    path = None
    if text is not None:
        path = tmp_path / "loopline.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=expected) as error:
        load_config(path, overrides)
    assert_clear(error.value)


def test_the_terminal_gets_the_first_line_without_beams_step_name():
    """A logged command's error: its first line (the log has the rest), without the name of the
    Beam step it came from."""
    import tensorflow as tf

    from pipeline.cli import _stop_message

    beam_error = ValueError("rows.csv: line 3: 4 cells where the header has 3: '1,2,3,4' [while running 'FileTypes[all]']")
    assert _stop_message(beam_error, logged=True) == "loopline: error: rows.csv: line 3: 4 cells where the header has 3: '1,2,3,4'"
    # A graph execution error: what the op said follows the stack where the op was made.
    op_error = tf.errors.InvalidArgumentError(None, None, (
        "Graph execution error:\n\nDetected at node map/Assert defined at (most recent call last):\n"
        '  File "trainer/features.py", line 194, in _checked\n\n'
        "assertion failed: [feature 'image': an image is not 8x8]\n\t [[{{node map/Assert}}]] [Op:__inference_parse_7]"))
    assert _stop_message(op_error, logged=True) == \
        "loopline: error: InvalidArgumentError: assertion failed: [feature 'image': an image is not 8x8]"
    assert _stop_message(op_error, logged=False) is None  # no log: the traceback is shown


# -- the real commands ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pushed_root(pipeline_run, tmp_path_factory) -> Path:
    """A copy of the shared run's root (a pushed, registered version), for failing runs to write
    their logs and metadata into."""
    config, _ = pipeline_run
    root = tmp_path_factory.mktemp("fuzz") / "root"
    shutil.copytree(config.pipeline.root, root, ignore=shutil.ignore_patterns("*.lock"))
    return root


def pushed_state(root: Path) -> tuple[dict, list]:
    """Every file of the serving folder (size and modification time), and the registered versions."""
    from tracking.target import TrackingTarget, embedded_store, make_client

    files = {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
             for p in sorted((root / "serving").rglob("*")) if p.is_file()}
    client = make_client(TrackingTarget(tracking_uri=embedded_store(str(root))[0]))
    versions = sorted(int(v.version) for v in client.search_model_versions("name = 'penguins'"))
    return files, versions


def loopline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=subprocess_env())


def bad_inputs(folder: Path) -> dict[str, tuple[list[str], str]]:
    """One bad input of each kind: the `loopline run` arguments and the error it must end with."""
    csv = folder / "bad.csv"
    csv.write_bytes(CSV_FOUND["ragged row with undecodable bytes"][0])
    tfrecord = folder / "bad.tfrecord"
    tfrecord.write_bytes(TFRECORD_FOUND["bytes that are not a tf.Example"][0])
    images = folder / "images"
    for label in ("cat", "dog"):
        (images / label).mkdir(parents=True)
        for i in range(3):
            (images / label / f"{i}.png").write_bytes(IMAGES["png"])
    (images / "dog" / "1.png").write_bytes(IMAGES["png"][:40])
    return {
        "csv": ([f"data.path={csv}"], f"loopline: error: {csv}: line 11: 3 cells where the header has 8: '46.5,,Dream'"),
        "tfrecord": ([f"data.path={tfrecord}", "data.format=tfrecord", "data.label=label"],
                     f"loopline: error: {tfrecord}: record 2: 10 bytes that are not a tf.Example"),
        "image": ([f"data.path={images}", "data.format=image_folder", "data.label=label"],
                  f"loopline: error: {images}/dog/1.png: not a readable image: Invalid PNG"),
        "config": (["trainer.epochs=many"],
                   f"loopline: error: {REPO / 'loopline.yaml'}: invalid configuration: 'trainer.epochs': Input should "
                   "be a valid integer"),
    }


def test_bad_inputs_stop_loopline_run_with_one_line_and_nothing_pushed(pushed_root, tmp_path):
    """A subprocess per kind of input (about 10 s each): exit code, the terminal's last line, no
    traceback, and the serving folder and the registry as they were."""
    before = pushed_state(pushed_root)
    assert before[0] and before[1], "the shared run pushed and registered a version"
    for kind, (overrides, expected) in bad_inputs(tmp_path).items():
        sets = [arg for o in [f"pipeline.root={pushed_root}", *overrides] for arg in ("--set", o)]
        done = loopline("run", "--config", str(REPO / "loopline.yaml"), *sets)
        err = done.stderr.strip().splitlines()
        assert done.returncode == (2 if kind == "config" else 1), (kind, done.stderr[-3000:])
        assert "Traceback" not in done.stdout + done.stderr, (kind, done.stderr[-3000:])
        assert err[-1].startswith(expected) and "[while running" not in err[-1], (kind, err[-1])
        assert len(err) <= 3, (kind, err)  # the failed component's line, the error
        assert pushed_state(pushed_root) == before, kind


def test_bad_example_stops_loopline_infer_with_one_line_and_no_output(pushed_root, tmp_path):
    """An example whose feature holds text where the model takes a number: before, TensorFlow's
    traceback."""
    data = tmp_path / "rows.tfrecord"
    data.write_bytes(b"".join(map(framed, [example(island=b"Dream"), example(bill_length_mm=b"long", island=b"Dream")])))
    output = tmp_path / "out" / "predictions.parquet"
    done = loopline("infer", str(data), "--format", "tfrecord", "--output", str(output), "--no-progress", "--config",
                    str(REPO / "loopline.yaml"), "--set", f"pipeline.root={pushed_root}")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"loopline: error: {data}: record 2: the model cannot take this example: Name: <unknown>, Key: bill_length_mm")
    assert not output.exists() and list(output.parent.iterdir()) == []  # nor a staged part of it
