"""Classification labels to targets: each row's class index looked up by its text's fingerprint,
then the text compared, exactly as comparing it with every class would encode it."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import trainer.heads as heads
from trainer.heads import MISSING_LABEL, UNSEEN_LABEL, Head


def _expected(vocabulary: list[str], values: list[str]) -> list[int]:
    index = {}
    for i, name in enumerate(vocabulary):
        index.setdefault(name, i)  # the first of a repeated class, as the compare with every class gives
    return [index.get(v, MISSING_LABEL if v == "" else UNSEEN_LABEL) for v in values]


def _values(vocabulary: list[str], rows: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    others = ["", "unseen", "c", "c1 ", "C1", "Adélie?"]  # missing, unseen, near misses
    return [str(v) for v in rng.choice(vocabulary + others, rows)]


@pytest.mark.parametrize("classes", [3, 2000])
def test_labels_encode_to_their_class_index_eagerly_traced_and_in_tf_data(classes):
    vocabulary = [f"c{i}" for i in range(classes - 1)] + ["Adélie"]
    head = Head("y", "classification", vocabulary)
    values = _values(vocabulary, 5000)
    column = tf.constant([[v] for v in values])
    expected = _expected(vocabulary, values)
    assert head.encode_label(column).numpy().tolist() == expected
    assert tf.function(head.encode_label)(column).numpy().tolist() == expected
    batches = tf.data.Dataset.from_tensor_slices(column).batch(512).map(head.encode_label)
    assert np.concatenate(list(batches.as_numpy_iterator())).tolist() == expected


def test_a_text_that_shares_a_class_fingerprint_is_still_unseen(monkeypatch):
    """A fingerprint only names a candidate class: the text decides. With 3 fingerprints, most
    unseen texts share one with a class."""
    monkeypatch.setattr(heads, "FINGERPRINTS", 3)
    vocabulary = [name for name in (f"k{i}" for i in range(50))
                  if tf.strings.to_hash_bucket_fast(name, 3).numpy() in (0, 1)][:1]
    vocabulary += [name for name in (f"k{i}" for i in range(50))
                   if tf.strings.to_hash_bucket_fast(name, 3).numpy() == 2][:1]
    head = Head("y", "classification", vocabulary)
    assert head._sorted_fingerprints is not None  # two classes, two fingerprints: the lookup is used
    values = vocabulary + [f"u{i}" for i in range(30)] + [""]
    assert head.encode_label(tf.constant([[v] for v in values])).numpy().tolist() == _expected(vocabulary, values)


def test_classes_sharing_a_fingerprint_or_repeated_are_compared_one_by_one(monkeypatch):
    repeated = Head("y", "classification", ["a", "b", "a"])
    values = ["a", "b", "", "q"]
    assert repeated._sorted_fingerprints is None
    assert repeated.encode_label(tf.constant([[v] for v in values])).numpy().tolist() == [0, 1, MISSING_LABEL, UNSEEN_LABEL]
    monkeypatch.setattr(heads, "FINGERPRINTS", 2)  # five classes in two fingerprints
    vocabulary = ["v", "w", "x", "y", "z"]
    sharing = Head("y", "classification", vocabulary)
    assert sharing._sorted_fingerprints is None
    values = _values(vocabulary, 300)
    assert sharing.encode_label(tf.constant([[v] for v in values])).numpy().tolist() == _expected(vocabulary, values)


def test_whole_numbers_are_classes_by_their_text():
    head = Head("n", "classification", ["1", "10", "2"], label_dtype="int64")
    column = tf.constant([[1.0], [2.0], [10.0], [np.nan], [2.5], [3.0], [-1.0]])
    assert head.encode_label(column).numpy().tolist() == [0, 2, 1, MISSING_LABEL, UNSEEN_LABEL, UNSEEN_LABEL, UNSEEN_LABEL]


def test_without_classes_every_label_is_unseen_or_missing():
    head = Head("y", "classification", [])
    assert head.encode_label(tf.constant([["a"], [""]])).numpy().tolist() == [UNSEEN_LABEL, MISSING_LABEL]
