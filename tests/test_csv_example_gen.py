"""The Arrow CSV ExampleGen writes the stock CsvExampleGen's artifact: run side by side on the
same CSVs, each split holds the same tf.Examples (values, types, missing values, split choice)."""
from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pytest
import tensorflow as tf

from ingestion.csv_options import CsvOptions
from tests.conftest import REPO

TRICKY = (
    'name,count,ratio,note,empty,mixed,big,odd_int\n'
    '"Smith, J.",+3,1.5,"said ""hi""",,1,9223372036854775808, 12\n'
    'Ünïcødé,-4,nan,"two\nlines",,2.5,1,1_000\n'
    '\n'
    ',5,-inf,"",,7,2,3\n'
    'x,0,1e3,plain,,,3,\n'
    '"",12,-nan,0x10,,-0,4,+7\n'
)


STOCK_RULE = CsvOptions(na_values=("",))  # the stock component's missing cell: the empty one only


def _run(executor, input_base: Path, out: Path, *, splits: dict[str, str] | None = None, options: CsvOptions | None = None):
    from tfx.components.example_gen import utils
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    if splits:
        input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name=n, pattern=p) for n, p in splits.items()])
        output_config = example_gen_pb2.Output()
    else:
        input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern="*.csv")])
        output_config = utils.make_default_output_config(input_config)
    from components.csv_example_gen import custom_config

    examples = standard_artifacts.Examples()
    examples.uri = str(out)
    properties = {
        "input_base": str(input_base),
        "input_config": proto_utils.proto_to_json(input_config),
        "output_config": proto_utils.proto_to_json(output_config),
        "output_data_format": example_gen_pb2.FORMAT_TF_EXAMPLE,
    }
    if options is not None:
        properties["custom_config"] = proto_utils.proto_to_json(custom_config(options))
    executor().Do({}, {"examples": [examples]}, properties)
    return examples


def _split(out: Path, name: str) -> list[bytes]:
    """The split's examples, each serialized deterministically, sorted: a multiset to compare."""
    files = glob.glob(str(out / f"Split-{name}" / "*"))
    assert files and all(f.endswith(".gz") for f in files), files
    records = tf.data.TFRecordDataset(files, compression_type="GZIP").as_numpy_iterator()
    return sorted(tf.train.Example.FromString(r).SerializeToString(deterministic=True) for r in records)


def _same_as_stock(tmp_path: Path, input_base: Path, splits: dict[str, str] | None = None,
                   options: CsvOptions | None = STOCK_RULE) -> dict[str, int]:
    from tfx.components.example_gen.csv_example_gen.executor import Executor as StockExecutor

    from components.csv_example_gen import Executor

    stock = _run(StockExecutor, input_base, tmp_path / "stock", splits=splits)
    ours = _run(Executor, input_base, tmp_path / "arrow", splits=splits, options=options)
    assert ours.split_names == stock.split_names
    sizes = {}
    for name in (splits or {"train": "", "eval": ""}):
        expected = _split(tmp_path / "stock", name)
        assert _split(tmp_path / "arrow", name) == expected, name
        sizes[name] = len(expected)
    return sizes


def test_same_splits_rows_and_types_as_stock_on_the_bundled_data(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(REPO / "data" / "penguins.csv", data / "penguins.csv")
    sizes = _same_as_stock(tmp_path, data, options=None)  # the defaults: no missing marker in this file but ''

    assert sizes["train"] > sizes["eval"] > 50  # the 2:1 hash split, not everything in one


def test_quoting_missing_values_and_number_spellings_as_stock(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "tricky.csv").write_text(TRICKY, encoding="utf-8")
    (data / "more.csv").write_text("name,count,ratio,note,empty,mixed,big,odd_int\nb,1,2,3,,4,5,6\n")
    _same_as_stock(tmp_path, data)
    out = tmp_path / "arrow" / "Split-train"
    records = tf.data.TFRecordDataset(glob.glob(str(tmp_path / "arrow" / "Split-*" / "*")), compression_type="GZIP")
    kinds = {}
    for record in records.as_numpy_iterator():
        for name, feature in tf.train.Example.FromString(record).features.feature.items():
            kinds.setdefault(name, set()).add(feature.WhichOneof("kind"))
    # What the stock rules say, spelled out: '+3' is an int, ' 12' and '1_000' too, 'nan' a float,
    # an int beyond int64 makes its column strings, an all-empty column has no kind.
    assert kinds["count"] == {"int64_list"} and kinds["odd_int"] == {"int64_list"}
    assert kinds["ratio"] == {"float_list"} and kinds["mixed"] == {"float_list"}
    assert kinds["big"] == {"bytes_list"} and kinds["name"] == {"bytes_list"}
    assert kinds["empty"] == {None}
    assert out.exists()


def test_given_train_and_eval_files_as_stock(tmp_path):
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "eval").mkdir()
    lines = (REPO / "data" / "penguins.csv").read_text().splitlines(keepends=True)
    (data / "train" / "a.csv").write_text("".join(lines[:200]))
    (data / "eval" / "b.csv").write_text(lines[0] + "".join(lines[200:]))
    sizes = _same_as_stock(tmp_path, data, {"train": "train/*.csv", "eval": "eval/*.csv"})
    assert sizes == {"train": 199, "eval": len(lines) - 200}


def test_bad_rows_and_headers_name_the_file(tmp_path):
    from components.csv_example_gen import Executor

    data = tmp_path / "data"
    data.mkdir()
    (data / "bad.csv").write_text('a,b\n1,2\n\n"x\ny",2\n3,4,5\n')  # a blank line and a quoted line end before it
    with pytest.raises(Exception, match=r"bad\.csv: line 6: 3 cells where the header has 2: '3,4,5'"):
        _run(Executor, data, tmp_path / "out1")
    os.remove(data / "bad.csv")
    (data / "dup.csv").write_text("a,a\n1,2\n")
    with pytest.raises(Exception, match=r"dup\.csv: the header names \['a'\] more than once"):
        _run(Executor, data, tmp_path / "out2")
