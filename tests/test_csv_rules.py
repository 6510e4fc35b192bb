"""CSVs as people export them, read by loopline's CSV rules (ingestion/csv_options.py) and checked
against pandas.read_csv on the same bytes: the same column names, number or text per column (an int
column with missing cells is INT), the same missing cells and the same values. Then the same rules
through the ExampleGen executor, `loopline train`'s conversion, the statistics, the checks before
a run, and one whole pipeline run."""
from __future__ import annotations

import glob
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from tfx_bsl.coders.csv_decoder import ColumnType

from ingestion import csv_records
from ingestion.csv_options import PANDAS_NA_VALUES, CsvError, CsvOptions
from tests.conftest import REPO, make_config, run_csv_example_gen

T = ColumnType


def read_ours(path: Path, options: CsvOptions) -> tuple[list[str], dict, list[tf.train.Example]]:
    """The header, the column types and the examples, in file order, as the ExampleGen reads them."""
    names, options = csv_records.read_header(str(path), options)
    types = csv_records.file_types(str(path), names, options)
    examples = [tf.train.Example.FromString(record)
                for batch in csv_records.read_batches(str(path), names, options)
                for record in csv_records.encode(batch, types).to_pylist()]
    return names, types, examples


def _cell(feature: tf.train.Feature):
    """A feature's one value, or None when the cell was missing."""
    kind = feature.WhichOneof("kind")
    values = list(getattr(feature, kind).value) if kind else []
    assert len(values) <= 1
    if not values:
        return None
    return values[0].decode("utf-8") if kind == "bytes_list" else values[0]


def assert_as_pandas(path: Path, options: CsvOptions, frame: pd.DataFrame) -> dict:
    """Our reading of `path` is pandas' `frame`; returns our types by column."""
    names, types, examples = read_ours(path, options)
    assert names == list(frame.columns)
    assert len(examples) == len(frame)
    for name in names:
        column = frame[name]
        ours = [_cell(e.features.feature[name]) for e in examples]
        assert [v is None for v in ours] == list(column.isna()), name  # the same missing cells
        present = column.dropna()
        if present.empty:  # pandas: float64 of NaN; the stock rule: a column with no type
            assert types[name] == T.UNKNOWN
            continue
        if column.dtype == object:
            assert types[name] == T.STRING, name
            assert [v for v in ours if v is not None] == list(present), name
            continue
        # A number column: INT when pandas reads ints (int64, or float64 for ints with missing cells).
        whole = column.dtype.kind == "i" or bool((present % 1 == 0).all())
        assert types[name] == T.INT if column.dtype.kind == "i" else types[name] in ((T.INT, T.FLOAT) if whole else (T.FLOAT,)), name
        got = np.array([v for v in ours if v is not None], np.float64)
        want = present.to_numpy(np.float64)
        np.testing.assert_array_equal(got, want.astype(np.float32) if types[name] == T.FLOAT else want, err_msg=name)
    return types


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_the_default_markers_are_pandas_own():
    from pandas._libs.parsers import STR_NA_VALUES

    assert set(PANDAS_NA_VALUES) == STR_NA_VALUES and len(PANDAS_NA_VALUES) == len(STR_NA_VALUES)


def test_excel_utf8_byte_order_mark_and_crlf(tmp_path):
    data = b"\xef\xbb\xbfmean radius,label,note\r\n17.99,1,ok\r\n20.57,0,\xc3\xa9t\xc3\xa9\r\n"
    path = write(tmp_path, "excel.csv", data)
    assert_as_pandas(path, CsvOptions(), pd.read_csv(io.BytesIO(data)))
    assert csv_records.read_header(str(path), CsvOptions())[0] == ["mean radius", "label", "note"]  # no \ufeff


def test_pandas_missing_markers_in_every_column(tmp_path):
    markers = [m for m in PANDAS_NA_VALUES if m]
    lines = ["age,fare,name,cabin"]
    for i, marker in enumerate(markers):  # each marker in each column, quoted in the text column
        lines.append(f'{marker},{i}.5,"{marker}",C{i}')
        lines.append(f"{20 + i},{marker},n{i},{marker}")
    lines += ["30,,x,", "31,1e3,,D"]  # the empty field too
    data = ("\n".join(lines) + "\n").encode()
    path = write(tmp_path, "markers.csv", data)
    types = assert_as_pandas(path, CsvOptions(), pd.read_csv(io.BytesIO(data)))
    assert types == {"age": T.INT, "fare": T.FLOAT, "name": T.STRING, "cabin": T.STRING}


@pytest.mark.parametrize("na_values", [["-", "missing", ""], ["NA", ""], ["NA"], []], ids=["own", "NA", "no-empty", "none"])
def test_data_na_values_replaces_the_list(tmp_path, na_values):
    data = b"x,y,z\n1,NA,a\n-,2,missing\n3,,NA\n4,5,\n"
    path = write(tmp_path, "own.csv", data)
    frame = pd.read_csv(io.BytesIO(data), na_values=na_values, keep_default_na=False)
    types = assert_as_pandas(path, CsvOptions(na_values=tuple(na_values)), frame)
    # A marker not in the list is text, the empty cell too.
    assert types["x"] == (T.INT if "-" in na_values else T.STRING)
    assert types["y"] == (T.INT if {"NA", ""} <= set(na_values) else T.STRING)


@pytest.mark.parametrize("delimiter,sep", [(";", ";"), ("\t", "\t"), ("|", "|"), ("auto", ";"), ("auto", "\t")])
def test_delimiters(tmp_path, delimiter, sep):
    """`auto` finds what pandas reads with the delimiter named (pandas' own sniffing, sep=None, reads
    the header alone and would cut this one at the comma in a name)."""
    data = sep.join(["id", "price (€)", "city, country", "note"]).encode() + b"\n"
    for i in range(5):
        data += sep.join([str(i), f"{i}.25" if i != 2 else "NA", '"Paris, FR"', f'"say ""{i}"""']).encode() + b"\n"
    path = write(tmp_path, "cut.csv", data)
    types = assert_as_pandas(path, CsvOptions(delimiter=delimiter), pd.read_csv(io.BytesIO(data), sep=sep))
    assert types == {"id": T.INT, "price (€)": T.FLOAT, "city, country": T.STRING, "note": T.STRING}


def test_auto_finds_a_tab_and_refuses_a_guess(tmp_path):
    data = b"a\tb\tc\n1\t2,5\t3\n4\t5\t6\n"
    path = write(tmp_path, "tabs.csv", data)
    assert_as_pandas(path, CsvOptions(delimiter="auto"), pd.read_csv(io.BytesIO(data), sep=None, engine="python"))
    one = write(tmp_path, "one.csv", b"only\n1\n2\n")
    assert read_ours(one, CsvOptions(delimiter="auto"))[0] == ["only"]  # no delimiter at all: one column
    odd = write(tmp_path, "odd.csv", b"a;b,c\nx,y;z;w\n1\n")
    with pytest.raises(CsvError, match=r"odd\.csv: cannot tell the delimiter .* set data\.delimiter"):
        csv_records.read_header(str(odd), CsvOptions(delimiter="auto"))


@pytest.mark.parametrize("encoding,text", [("latin-1", "Zürich,café,ÿ"), ("cp1252", "€ 5,naïve,œuvre")])
def test_data_encoding_reads_latin1_and_cp1252(tmp_path, encoding, text):
    data = f"name,wort,other\n{text}\n1,2,3\n".encode(encoding)
    path = write(tmp_path, f"{encoding}.csv", data)
    assert_as_pandas(path, CsvOptions(encoding=encoding), pd.read_csv(io.BytesIO(data), encoding=encoding))
    with pytest.raises(CsvError, match=r"line 2, byte offset \d+: 0x[0-9a-f]+ in column 'name' is not valid utf-8 .*data\.encoding"):
        read_ours(path, CsvOptions())  # not UTF-8
    with pytest.raises(UnicodeDecodeError):
        pd.read_csv(io.BytesIO(data))  # pandas refuses the same bytes, without saying where


def test_invalid_utf8_names_the_line_byte_and_column(tmp_path):
    good = b"id,name,score\n" + b"".join(b"%d,n%d,%d\n" % (i, i, i) for i in range(2000))  # past the header's sample
    data = good + b'2000,"two\nlines",1\n2001,caf\xe9,2\n'
    path = write(tmp_path, "bad.csv", data)
    at = data.index(b"\xe9")
    line = data[:at].count(b"\n") + 1
    names, options = csv_records.read_header(str(path), CsvOptions())  # the header is fine
    with pytest.raises(CsvError) as error:
        csv_records.file_types(str(path), names, options)  # the pass that infers the types stops
    assert str(error.value) == (f"{path}: line {line}, byte offset {at}: 0xe9 in column 'name' is not valid utf-8 "
                                "(invalid continuation byte); set data.encoding to the file's encoding "
                                "(e.g. latin-1 or cp1252)")
    header = write(tmp_path, "header.csv", b"id,caf\xe9\n1,2\n")
    with pytest.raises(CsvError, match=r"header\.csv: line 1, byte offset 6: 0xe9 is not valid utf-8"):
        csv_records.read_header(str(header), CsvOptions())


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64])
def test_lines_and_bytes_are_found_across_read_chunks(size):
    """The file is read again in chunks to name the place: a character or a CRLF cut by a chunk
    boundary counts once."""
    from ingestion.csv_options import line_of_row, undecodable

    data = 'a;b\r\nÜber;"x\r\ny"\r\n\r\nœ;2\r\n'.encode("utf-8") + b"\xe9;3\r\n"
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    error = undecodable("f.csv", iter(chunks), "utf-8")
    assert str(error).startswith(f"f.csv: line 6, byte offset {data.index(0xe9)}: 0xe9 is not valid utf-8")
    cut = "a;b\nx;Ü".encode("utf-8")[:-1]  # the file ends inside a character
    error = undecodable("f.csv", iter([cut[i:i + size] for i in range(0, len(cut), size)]), "utf-8")
    assert str(error).startswith(f"f.csv: line 2, byte offset {len(cut) - 1}: 0xc3 is not valid utf-8 (unexpected end of data)")
    assert undecodable("f.csv", iter([data[:data.index(0xe9)]]), "utf-8") is None
    options = CsvOptions(delimiter=";", encoding="latin-1")
    assert [line_of_row(iter(chunks), options, row) for row in (1, 2, 3, 4, 5)] == [1, 2, 5, 6, None]


def test_a_short_row_names_the_line(tmp_path):
    path = write(tmp_path, "short.csv", b"a;b\n1;2\n\n3\n")
    names, options = csv_records.read_header(str(path), CsvOptions(delimiter=";"))
    with pytest.raises(CsvError, match=r"short\.csv: line 4: 1 cells where the header has 2: '3'"):
        csv_records.file_types(str(path), names, options)


QUIRKY = ("id;sex;age;fare;cabin\n"
          + "".join(f"{i};{'male' if i % 2 else 'NA'};{'NA' if i % 5 == 0 else 20 + i % 40};"
                    f"{'' if i % 7 == 0 else f'{i % 13}.5'};{'n/a' if i % 3 else f'C{i} €'}\n" for i in range(90)))


def _records(pattern: str) -> list[bytes]:
    files = glob.glob(pattern)
    assert files, pattern
    return sorted(r for r in tf.data.TFRecordDataset(files, "GZIP").as_numpy_iterator())


@pytest.mark.parametrize("encoding,bom", [("utf-8", b"\xef\xbb\xbf"), ("cp1252", b"")])
def test_executor_train_conversion_and_statistics_read_the_same(tmp_path, encoding, bom):
    """The options reach the ExampleGen executor through custom_config; `loopline train`'s conversion
    writes the same examples (byte for byte); the statistics count the markers as missing."""
    from trainer.csv_examples import csv_to_tfrecords
    from validation.statistics import compute_statistics, common_stats

    data = bom + QUIRKY.encode(encoding)
    (tmp_path / "in").mkdir()
    path = write(tmp_path / "in", "quirky.csv", data)
    options = CsvOptions(delimiter="auto", encoding=encoding)
    frame = pd.read_csv(io.BytesIO(data), sep=";", encoding=encoding)
    types = assert_as_pandas(path, options, frame)
    assert types == {"id": T.INT, "sex": T.STRING, "age": T.INT, "fare": T.FLOAT, "cabin": T.STRING}

    run_csv_example_gen(tmp_path / "in", tmp_path / "gen", options)
    ours = [tf.train.Example.FromString(r) for split in ("train", "eval") for r in _records(str(tmp_path / "gen" / f"Split-{split}" / "*"))]
    assert sorted(e.SerializeToString(deterministic=True) for e in ours) == \
        sorted(e.SerializeToString(deterministic=True) for e in read_ours(path, options)[2])
    train, evaluation = csv_to_tfrecords(str(path), str(tmp_path / "train"), options)
    assert sorted(_records(train) + _records(evaluation)) == sorted(_records(str(tmp_path / "gen" / "Split-*" / "*")))

    missing = {name: 0 for name in frame.columns}
    for split in ("train", "eval"):
        stats = compute_statistics(str(tmp_path / "gen" / f"Split-{split}" / "*"), split)
        for feature in stats.features:
            missing[feature.name] += common_stats(feature).num_missing
    assert missing == frame.isna().sum().to_dict()
    assert missing["age"] == 18 and missing["cabin"] == 60 and missing["id"] == 0


def test_the_pipeline_hands_the_options_to_example_gen(tmp_path):
    """The options are ExampleGen's custom_config: an execution property, so a changed option is a
    new execution, not a cache hit."""
    from components.csv_example_gen import csv_options
    from pipeline.pipeline import create_pipeline

    config = make_config(tmp_path, "data.delimiter=auto", "data.na_values=['', '-']", "data.encoding=cp1252",
                         "mlflow.enabled=false")
    node = next(c for c in create_pipeline(config).components if c.id == "CsvExampleGen")
    given = csv_options(node.exec_properties)  # the JSON the executor receives
    assert given == config.data.csv_options() == CsvOptions(("", "-"), "auto", "cp1252")


def test_the_executor_writes_nothing_from_a_file_that_is_not_utf8(tmp_path):
    """The eval file is not UTF-8: no example of the train split is written either."""
    for split in ("train", "eval"):
        (tmp_path / "in" / split).mkdir(parents=True)
    write(tmp_path / "in" / "train", "a.csv", b"id,name\n" + b"".join(b"%d,ok\n" % i for i in range(500)))
    data = write(tmp_path / "in" / "eval", "b.csv", b"id,name\n2,ok\n3,Z\xfcrich\n").read_bytes()
    with pytest.raises(Exception, match=rf"b\.csv: line 3, byte offset {data.index(0xfc)}: 0xfc in column 'name' is not valid utf-8"):
        run_csv_example_gen(tmp_path / "in", tmp_path / "gen", CsvOptions(), {"train": "train/*.csv", "eval": "eval/*.csv"})
    assert [p for p in glob.glob(str(tmp_path / "gen" / "**"), recursive=True) if os.path.isfile(p)] == []


def test_loopline_train_stops_on_bytes_it_cannot_decode(tmp_path):
    from trainer.csv_examples import csv_to_tfrecords

    path = write(tmp_path, "x.csv", b"id,name\n1,ok\n3,Z\xfcrich\n")
    with pytest.raises(CsvError, match=rf"x\.csv: line 3, byte offset {path.read_bytes().index(0xfc)}: 0xfc"):
        csv_to_tfrecords(str(path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # refused before any file was written
    csv_to_tfrecords(str(path), str(tmp_path / "out"), CsvOptions(encoding="latin-1"))
    names = {tf.train.Example.FromString(r).features.feature["name"].bytes_list.value[0].decode()
             for r in _records(str(tmp_path / "out" / "*" / "*.gz"))}
    assert names == {"ok", "Zürich"}


def _cli(capsys, tmp_path, *sets: str) -> tuple[int, str]:
    from pipeline.cli import main

    args = ["run", "--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={tmp_path}/ws"]
    for value in sets:
        args += ["--set", value]
    code = main(args)
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("key,value", [("na_values", "[NA]"), ("delimiter", ";"), ("encoding", "latin-1")])
def test_the_stock_example_gen_refuses_options_it_cannot_honour(capsys, tmp_path, key, value):
    code, err = _cli(capsys, tmp_path, "data.example_gen=stock", f"data.{key}={value}")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"loopline: error: data.{key}: data.example_gen stock (TFX's CsvExampleGen) reads")
    assert not (tmp_path / "ws").exists()


def test_the_checks_before_a_run_read_headers_by_the_same_rules(capsys, tmp_path):
    from pipeline.checks import check_data
    from pipeline.config import load_config

    path = write(tmp_path, "excel.csv", "\ufeffwert;species\n1;A\n".encode("utf-8"))
    config = load_config(REPO / "loopline.yaml", [f"data.path={path}", "data.delimiter=auto"])
    assert check_data(config) == ["wert", "species"]
    code, err = _cli(capsys, tmp_path, f"data.path={path}", "data.delimiter=auto", "data.example_gen=stock")
    assert code == 2 and "data.delimiter: data.example_gen stock" in err
    code, err = _cli(capsys, tmp_path, f"data.path={path}", "data.example_gen=stock")
    assert code == 2 and err.endswith("excel.csv starts with a UTF-8 byte-order mark, which data.example_gen stock "
                                      "(TFX's CsvExampleGen) keeps in the first column's name; use data.example_gen arrow")
    bad = write(tmp_path, "latin.csv", "größe,species\n1,A\n".encode("latin-1"))
    code, err = _cli(capsys, tmp_path, f"data.path={bad}")
    assert code == 2 and err == (f"loopline: error: data.path: {bad}: line 1, byte offset 2: 0xf6 is not valid utf-8 "
                                 "(invalid start byte); set data.encoding to the file's encoding (e.g. latin-1 or cp1252)")
    assert load_config(REPO / "loopline.yaml", [f"data.path={bad}", "data.encoding=latin-1"]).data.csv_options().encoding == "latin-1"
    assert not (tmp_path / "ws").exists()


@pytest.mark.slow
def test_pipeline_on_an_excel_export_with_na_markers(tmp_path):
    """A whole run on a CSV saved by Excel as "CSV UTF-8" (a BOM, CRLF) with R's and pandas' NA
    markers: the schema has the clean name and numeric columns, the statistics count the markers."""
    from pipeline.local_runner import run_local
    from validation.schema import load_schema
    from validation.statistics import common_stats, read_statistics

    rng = np.random.default_rng(0)
    lines = ["mean radius,age,label"]
    for i in range(120):
        label = i % 2
        radius = "NA" if i % 6 == 0 else f"{10 + 5 * label + rng.normal():.2f}"
        age = "N/A" if i % 4 == 0 else str(30 + 10 * label + int(rng.integers(0, 5)))
        lines.append(f"{radius},{age},{'yes' if label else 'no'}")
    path = write(tmp_path, "export.csv", b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    config = make_config(tmp_path / "root", f"data.path={path}", "data.label=label", "trainer.epochs=1",
                         "export.tflite_variants=[]", "mlflow.enabled=false", "serving.model_name=excel")
    summary = run_local(config)
    assert summary.saved_model is not None
    schema = load_schema(glob.glob(os.path.join(config.pipeline.root, "tfx", "SchemaGen", "schema", "*"))[0])
    types = {f.name: f.type for f in schema.feature}
    from tensorflow_metadata.proto.v0 import schema_pb2

    assert types == {"mean radius": schema_pb2.FLOAT, "age": schema_pb2.INT, "label": schema_pb2.BYTES}
    missing = {"mean radius": 0, "age": 0}
    for split in glob.glob(os.path.join(config.pipeline.root, "tfx", "StatisticsGen", "statistics", "*", "Split-*")):
        for feature in read_statistics(split).features:
            if feature.name in missing:
                missing[feature.name] += common_stats(feature).num_missing
    assert missing == {"mean radius": 20, "age": 30}


def test_predict_reads_rows_by_the_same_rules(tmp_path):
    """`loopline predict rows.csv` reads by the pipeline's rules, checked against pandas on the same
    bytes: a byte-order mark is not part of a name, the missing markers are missing (NaN for a
    number, "" for text, as in training), `;` found by `auto`; latin-1 through data.encoding; bytes
    the encoding cannot read stop, naming the line."""
    from serving.client import read_rows, rows_to_columns

    path = tmp_path / "rows.csv"
    path.write_bytes("\ufeffbill_length_mm;island\n39.1;NA\nN/A;Biscoe\n#N/A;\n".encode())
    rows = read_rows(str(path), CsvOptions(delimiter="auto"))
    frame = pd.read_csv(path, sep=";")
    assert [list(r) for r in rows] == [list(frame.columns)] * 3 == [["bill_length_mm", "island"]] * 3
    assert [[v is None for v in r.values()] for r in rows] == frame.isna().values.tolist()
    columns = rows_to_columns(rows, {"bill_length_mm": "float", "island": "string"})
    assert columns["bill_length_mm"][0, 0] == pytest.approx(39.1) and np.isnan(columns["bill_length_mm"][1:, 0]).all()
    assert list(columns["island"][:, 0]) == [b"", b"Biscoe", b""]

    path.write_bytes("island\nDream\xe9\n".encode("latin-1"))
    assert read_rows(str(path), CsvOptions(encoding="latin-1")) == [{"island": "Dream\xe9"}]
    with pytest.raises(CsvError, match="line 2"):
        read_rows(str(path))
