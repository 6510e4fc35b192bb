"""The bare script's input: every training row once per epoch, in a new order each epoch, the
validation rows in order, gathered from the columns as they are."""
from __future__ import annotations

import numpy as np


def test_batches_give_every_row_once_per_epoch_reshuffled_and_in_order_without_shuffle():
    import tensorflow as tf

    from bench.scale_script import batches

    tf.random.set_seed(0)  # as a seeded script (or an earlier test) leaves it: fit still reshuffles then

    rows = 1000
    columns = ({"n": tf.constant(np.arange(rows, dtype=np.float32)[:, None]),
                "s": tf.constant(np.array([str(i) for i in range(rows)], dtype=object)[:, None])},
               {"y": tf.constant(np.arange(rows))})
    shuffled = batches(tf, columns, 256, shuffle=True)
    epochs = [np.concatenate([y["y"].numpy() for _, y in shuffled]) for _ in range(2)]
    for order in epochs:
        assert sorted(order) == list(range(rows))  # each row once, the last batch partial
    assert list(epochs[0]) != list(epochs[1]) != list(range(rows))  # a new order each epoch
    for (x, y) in shuffled.take(2):  # a row's columns stay together
        assert (x["n"].numpy()[:, 0] == y["y"].numpy()).all()
        assert [int(s) for s in x["s"].numpy()[:, 0]] == list(y["y"].numpy())
    in_order = batches(tf, columns, 256, shuffle=False)
    assert [len(y["y"]) for _, y in in_order] == [256, 256, 256, 232]
    assert list(np.concatenate([y["y"].numpy() for _, y in in_order])) == list(range(rows))
