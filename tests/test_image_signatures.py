"""Text that starts like a GIF or BMP file ("BMW", "BM-0042", "GIF89a ...") is text to the
statistics, the schema and the Trainer; real PNG, JPEG, GIF and BMP files are images to all three."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from ingestion.images import looks_like_image
from validation.statistics import is_image_feature, summarize_batch, to_statistics, value_counts

TEXT = [b"BMW", b"BM-0042", b"GIF89a and more words", b"GIF87a", b"BM"]


def _image(fmt: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), 200, np.uint8)).save(out, format=fmt)
    return out.getvalue()


IMAGES = {fmt: _image(fmt) for fmt in ("PNG", "JPEG", "GIF", "BMP")}


@pytest.mark.parametrize("fmt", sorted(IMAGES))
def test_image_files_are_images(fmt):
    assert looks_like_image(IMAGES[fmt])


@pytest.mark.parametrize("text", TEXT)
def test_text_with_an_image_signature_is_text(text):
    assert not looks_like_image(text)


def _statistics(values: list[bytes]):
    column = pa.LargeListArray.from_arrays(pa.array(np.arange(len(values) + 1), pa.int64()), pa.array(values, pa.large_binary()))
    [feature] = to_statistics("x", *summarize_batch(pa.RecordBatch.from_arrays([column], ["car"]))).features
    return feature


def test_statistics_count_such_text_as_values():
    feature = _statistics([b"BMW", b"Audi", b"BMW", b"GIF89a", b"BM-0042"])
    assert not is_image_feature(feature)
    assert value_counts(feature) == {"BMW": 2, "Audi": 1, "GIF89a": 1, "BM-0042": 1}
    assert not is_image_feature(_statistics([b"BM-0001", b"BM-0002"]))  # every value: still text


def test_statistics_of_image_files_are_bytes_statistics():
    feature = _statistics(list(IMAGES.values()))
    assert is_image_feature(feature) and not value_counts(feature)


def test_the_trainer_reads_such_text_as_strings_and_images_as_images(tmp_path):
    from trainer.features import IMAGE, infer_feature_kinds

    path = str(tmp_path / "records.gz")
    with tf.io.TFRecordWriter(path, "GZIP") as writer:
        for i in range(6):
            feature = {"code": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"BM-{i:04d}".encode()])),
                       "picture": tf.train.Feature(bytes_list=tf.train.BytesList(value=[IMAGES["BMP" if i % 2 else "GIF"]]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    kinds = infer_feature_kinds(path)
    assert kinds["code"] == "string"
    assert kinds["picture"] == f"{IMAGE}[4,5,3]"  # decoded: 4 x 5 pixels, RGB
