"""GFileStream: Arrow's writers and readers on a tf.io.gfile path, local and `ram://`,
as the hand-over's columns and `loopline infer`'s output use it."""
from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import tests.ram_filesystem  # noqa: F401 - ram:// as an object store
from trainer.arrow_io import GFileStream

TABLE = pa.table({"x": pa.array(range(1000), pa.int64()), "s": pa.array([f"row {i}" for i in range(1000)])})


@pytest.fixture(params=["local", "ram"])
def folder(request, tmp_path):
    return str(tmp_path) if request.param == "local" else f"ram://arrow-io-{uuid.uuid4().hex}"


def test_an_ipc_stream_written_and_read_back(folder):
    path = f"{folder}/t.arrow"
    with pa.PythonFile(GFileStream(path, "wb"), mode="w") as sink:
        with pa.ipc.new_stream(sink, TABLE.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
            writer.write_table(TABLE, max_chunksize=300)
    with GFileStream(path, "rb") as source:
        assert pa.ipc.open_stream(pa.PythonFile(source, mode="r")).read_all().equals(TABLE)


def test_a_parquet_file_written_through_the_stream_as_sink(folder):
    path = f"{folder}/t.parquet"
    stream = GFileStream(path, "wb")
    with pq.ParquetWriter(stream, TABLE.schema) as writer:
        writer.write_table(TABLE)
    stream.close()
    with tf.io.gfile.GFile(path, "rb") as f:  # Parquet reads its footer first: a seekable buffer
        assert pq.read_table(pa.BufferReader(f.read())).equals(TABLE)


def test_only_binary_read_or_write():
    with pytest.raises(ValueError, match="mode must be"):
        GFileStream("ram://x", "a")
