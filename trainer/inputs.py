"""tf.data input over ExampleGen's GZIP TFRecord splits: files interleaved in parallel, cached,
shuffled, batched then parsed (one parse call per batch, not per example), labels encoded,
prefetched. A training split small enough is parsed once and held in memory as columns."""
from __future__ import annotations

import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, Iterator, Sequence

import tensorflow as tf
from tensorflow.python.util import deprecation

from trainer import handover, holdout
from trainer.config import InputConfig
from trainer.features import FeatureKinds, parse_examples
from trainer.heads import Head

log = logging.getLogger("loopline.trainer")


def record_dataset(file_pattern: str, config: InputConfig | None = None) -> tf.data.Dataset:
    config = config or InputConfig()
    files = tf.io.gfile.glob(file_pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern}")
    cycle_length = min(len(files), config.parallel_reads)
    if cycle_length == 1:  # the same order without the interleave, which costs more per record than the read
        return tf.data.TFRecordDataset(sorted(files), compression_type="GZIP")
    return tf.data.Dataset.from_tensor_slices(sorted(files)).interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type="GZIP"),
        cycle_length=cycle_length,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=config.deterministic,
    )


def record_chunks(file_pattern: str, size: int) -> Iterator[list[bytes]] | None:
    """The split's serialized records in lists of `size` (the last shorter), read by TensorFlow's
    record reader (any file system, each record's CRC checked), for a pass that reads a split of
    one file once, in order: tf.data makes an element of every record, which costs more than
    the read (665k records: 2.3-2.9 CPU s through TFRecordDataset and batch, 1.4 this way). None
    when the split has more files (record_dataset interleaves them, and its order is kept), or
    where TensorFlow no longer has the reader (deprecated for tf.data): the caller reads with tf.data."""
    files = tf.io.gfile.glob(file_pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern}")
    reader = getattr(tf.compat.v1.io, "tf_record_iterator", None)
    if len(files) > 1 or reader is None:
        return None
    with deprecation.silence():  # deprecated for tf.data, which is what costs here
        records = reader(files[0], tf.io.TFRecordOptions(compression_type="GZIP"))
    return _read_ahead(lambda: list(itertools.islice(records, size)))


def _read_ahead(read: Callable[[], list]) -> Iterator[list]:
    """`read()`'s answers until an empty one, the next read in a thread while the caller works on
    the last (the reader releases the GIL while it decompresses and checks)."""
    with ThreadPoolExecutor(1, thread_name_prefix="records") as reader:
        pending = reader.submit(read)
        while chunk := pending.result():
            pending = reader.submit(read)
            yield chunk


def parsed_chunks(file_pattern: str, size: int, parse: Callable, limit: int | None = None
                  ) -> Iterator[tuple[tf.Tensor, dict[str, tf.Tensor]]]:
    """The split's first `limit` records (None or 0: all) in record_dataset's order, `size` at a
    time: each chunk of serialized records and `parse`'s answer for it. Read by `record_chunks`
    where it can, else by tf.data (the chunks parsed in parallel)."""
    chunks = record_chunks(file_pattern, size)  # raises here when no file matches
    if chunks is None:
        dataset = record_dataset(file_pattern)
        if limit:
            dataset = dataset.take(limit)
        dataset = dataset.batch(size).map(lambda serialized: (serialized, parse(serialized)),
                                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return iter(read_once(dataset.prefetch(1)))
    parse_chunk = tf.function(parse, input_signature=[tf.TensorSpec([None], tf.string)])

    def parsed():
        for chunk in _first_rows(chunks, limit):
            serialized = tf.constant(chunk)
            yield serialized, parse_chunk(serialized)

    return parsed()


def _first_rows(chunks: Iterator[list], limit: int | None) -> Iterator[list]:
    """The chunks up to `limit` rows in all (None or 0: all of them, as dataset.take is skipped then)."""
    if not limit:
        yield from chunks
        return
    for chunk in chunks:
        yield chunk[:limit]
        limit -= len(chunk)
        if limit <= 0:
            return


def _splitter(kinds: FeatureKinds, heads: list[Head]):
    split_labels = _label_splitter(heads)

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def split(serialized):
        return split_labels(parse_examples(serialized, kinds))

    return split


def _label_splitter(heads: list[Head]):
    """Parsed columns -> (features, targets): the label columns taken out, encoded per head."""
    labels = {head.name for head in heads}

    @tf.autograph.experimental.do_not_convert  # as above
    def split(parsed):
        features = {k: v for k, v in parsed.items() if k not in labels}
        targets = {head.name: head.encode_label(parsed[head.name]) for head in heads}
        return features, targets

    return split


def read_once(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """For a pass that reads a split's records once, in order (the in-memory load, evaluations,
    statistics, counts): tf.data's autotuning off. It times every element it passes, here a record
    each: reading a 665k-record split into memory took 1.29 -> 1.08 CPU s (0.85 -> 0.70 s wall)
    without it. The same elements in the same order; AUTOTUNE then takes tf.data's fixed defaults."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _finish(dataset: tf.data.Dataset, config: InputConfig) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = config.deterministic
    # Shard by element, not by file: ExampleGen writes few files, often fewer than workers.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


_CHUNK = 8192  # rows parsed per call when a whole split is read


# Picks the records of a batch of serialized records to use (trainer.holdout: the training or the
# validation rows); None: every record.
Rows = Callable[[tf.Tensor], tf.Tensor] | None


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def _picked(serialized: tf.Tensor, rows: Rows) -> tf.Tensor:
    return serialized if rows is None else rows(serialized)


MARKED = "__marked__"  # parsed_columns' column of `mark`'s answers (not a feature: no signature name has underscores at both ends)


def parsed_columns(file_pattern: str, kinds: FeatureKinds, max_bytes: int, rows: Rows = None,
                   mark: Rows = None) -> dict[str, tf.Tensor] | None:
    """The whole split (its `rows`) parsed, every column (labels included) a `[rows, ...]` tensor
    keyed by its signature name, or None when they would take more than `max_bytes` (or the split
    is empty). `mark`: a bool per record of a batch of serialized records (e.g. trainer.holdout's
    held_out), kept as the column MARKED, so one read both parses and sorts the records."""
    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def parse(serialized):
        serialized = _picked(serialized, rows)
        parsed = parse_examples(serialized, kinds)
        return parsed if mark is None else {**parsed, MARKED: mark(serialized)}

    chunks, size = [], 0
    for _, parsed in parsed_chunks(file_pattern, _CHUNK, parse):
        for column in parsed.values():
            size += int(tf.reduce_sum(tf.strings.length(column))) + 16 * int(tf.size(column)) \
                if column.dtype == tf.string else column.dtype.size * int(tf.size(column))
        if size > max_bytes:
            return None
        chunks.append(parsed)
    return _concat(chunks)


def split_marked(columns: dict[str, tf.Tensor]) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor]]:
    """parsed_columns' rows `mark` did not pick and the rows it picked, each in the split's order."""
    marked = columns[MARKED]
    rest = {k: v for k, v in columns.items() if k != MARKED}
    return _rows_where(rest, tf.logical_not(marked)), _rows_where(rest, marked)


def _rows_where(columns: dict[str, tf.Tensor], keep: tf.Tensor) -> dict[str, tf.Tensor]:
    """The rows of columns where `keep` (a bool per row) is true, in their order."""
    return {name: tf.boolean_mask(column, keep) for name, column in columns.items()}


def _rows(columns) -> int:
    """Rows of held columns (any nest of `[rows, ...]` tensors)."""
    return int(tf.shape(tf.nest.flatten(columns)[0])[0])


def load_in_memory(file_pattern: str, kinds: FeatureKinds, config: InputConfig, batch_size: int,
                   rows: Rows = None, held_out: float = 0.0, columns_file: str | None = None
                   ) -> dict[str, tf.Tensor] | None:
    """The training split (its `rows`) parsed once (`parsed_columns`) when it fits
    `config.in_memory_mb` and holds a batch; None when it is to be streamed. Logs which, and why.
    `held_out`: a fraction whose validation rows (trainer.holdout) are marked in the column MARKED.
    The columns handed over with the split's records (`columns_file`: trainer.handover.columns_file's
    answer, with the buckets where `held_out`) are taken instead of a parse of all its rows where
    they are there: the same tensors, the same marks."""
    if not config.in_memory_mb:
        log.info("training split streamed from its records (trainer.input.in_memory_mb=0)")
        return None
    max_bytes = config.in_memory_mb * 2**20
    columns_file = columns_file if rows is None else None
    if columns_file is not None:
        columns = _handed_over_columns(columns_file, kinds, max_bytes,
                                       partial(holdout.held_out_buckets, fraction=held_out) if held_out else None)
    else:
        columns = parsed_columns(file_pattern, kinds, max_bytes, rows,
                                 partial(holdout.held_out, fraction=held_out) if held_out else None)
    count = _rows(columns) if columns is not None else 0
    if count >= batch_size:
        log.info("training split %s and held in memory (%d rows)",
                 "handed over as columns" if columns_file is not None else "parsed once", count)
        return columns
    log.info("training split streamed from its records (%s)", "fewer rows than one batch" if columns is not None
             else f"empty, or over trainer.input.in_memory_mb={config.in_memory_mb} once parsed")
    return None


def _handed_over_columns(path: str, kinds: FeatureKinds, max_bytes: int, mark: Rows) -> dict[str, tf.Tensor] | None:
    """parsed_columns' answer from the columns handed over in `path` (`mark` of their buckets):
    None when they would take more than `max_bytes`, known from a first read that converts
    nothing (a split too big is decided without holding any of it), or when there are none."""
    size = sum(handover.in_memory_bytes(batch, kinds) + (batch.num_rows if mark else 0)
               for batch in handover.read_blocks(path))
    if size > max_bytes:
        return None
    chunks = []
    for batch in handover.read_blocks(path):
        columns = handover.to_columns(batch, kinds)
        if mark is not None:
            columns[MARKED] = mark(handover.buckets(batch))
        chunks.append(columns)
    return _concat(chunks)


def _concat(chunks: list[dict[str, tf.Tensor]]) -> dict[str, tf.Tensor] | None:
    """Chunks of columns as one set of columns (None: no chunk)."""
    if not chunks:
        return None
    return {name: tf.concat([chunk[name] for chunk in chunks], axis=0) for name in chunks[0]}


def columns_dataset(columns: dict[str, tf.Tensor], heads: list[Head], batch_size: int, config: InputConfig) -> tf.data.Dataset:
    """One pass over held columns in the order they hold, as `make_dataset` reads the same rows
    from their records: `(features, targets)` batches of `batch_size`, the last one shorter."""
    labels = {head.name for head in heads}

    def batch(start):
        rows = {name: column[start:start + batch_size] for name, column in columns.items()}
        return ({k: v for k, v in rows.items() if k not in labels},
                {head.name: head.encode_label(rows[head.name]) for head in heads})

    starts = tf.data.Dataset.range(0, _rows(columns), batch_size)
    return _finish(starts.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True), config)


_STATISTICS_ROWS = 1 << 16  # rows per statistics batch of held columns: a few eager ops per column and batch


def column_batches(columns: dict[str, tf.Tensor], batch_size: int = _STATISTICS_ROWS):
    """Held columns in batches of `batch_size` rows, as `parsed_batches` gives them but as
    tensors (for statistics, which count a text column's values without a Python object per row)."""
    rows = _rows(columns)
    sizes = [batch_size] * (rows // batch_size) + ([rows % batch_size] if rows % batch_size else [])
    pieces = {name: tf.split(column, sizes) for name, column in columns.items()}  # one op a column, not one a batch
    for index in range(len(sizes)):
        yield {name: pieces[name][index] for name in columns}


def _in_memory_stream(columns, batch_size: int, seed: int, skip_batches: int, config: InputConfig) -> tf.data.Dataset:
    """Every epoch a full shuffle of the rows (by index, stateless: the same on every run), cut
    into `rows // batch_size` batches gathered from the columns. Nothing is parsed again."""
    rows = _rows(columns)
    per_epoch = rows // batch_size

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def epoch_batches(epoch):
        order = tf.random.experimental.stateless_shuffle(tf.range(rows), seed=tf.stack([tf.cast(seed, tf.int64), epoch]))
        return tf.data.Dataset.from_tensor_slices(tf.reshape(order[: per_epoch * batch_size], [per_epoch, batch_size]))

    indices = tf.data.Dataset.counter().flat_map(epoch_batches)
    if skip_batches:
        indices = indices.skip(skip_batches)
    gather = tf.autograph.experimental.do_not_convert(
        lambda index: tf.nest.map_structure(lambda column: tf.gather(column, index), columns))
    dataset = indices.map(gather,
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic)
    return _finish(dataset, config)


def training_stream(
    file_pattern: str,
    kinds: FeatureKinds,
    heads: list[Head],
    batch_size: int,
    config: InputConfig,
    seed: int,
    skip_batches: int = 0,
    columns: dict[str, tf.Tensor] | None = None,
    augment=None,
    rows: Rows = None,
) -> tf.data.Dataset:
    """An endless stream of full (features, targets) batches, reshuffled each epoch: from
    `columns` (`load_in_memory`) when given, else streamed from the records.

    With a fixed seed the stream is the same on every run, so resuming skips the batches a
    checkpoint says were consumed and continues exactly where training stopped. Full batches keep
    shapes static (one XLA compilation, even splits across replicas).

    `augment(features, targets, rng)` (a model module's): applied to each training batch, `rng` a
    stateless seed pair (int64 [2]) for `tf.random.stateless_*`, from `seed` and the batch's index,
    so a resumed run sees the same augmentations.

    `rows`: the records streamed ones are taken from (e.g. trainer.holdout's training rows).
    """
    if columns is not None:
        labels = {head.name for head in heads}
        features = {name: column for name, column in columns.items() if name not in labels}
        targets = {head.name: head.encode_label(columns[head.name]) for head in heads}  # one call: a few ops per row
        return _augmented(_in_memory_stream((features, targets), batch_size, seed, skip_batches, config),
                          augment, seed, skip_batches, config)
    dataset = _streamed_windows(file_pattern, kinds, heads, config, seed, rows).rebatch(batch_size, drop_remainder=True)
    if skip_batches:
        dataset = dataset.skip(skip_batches)
    return _augmented(_finish(dataset, config), augment, seed, skip_batches, config)


_WINDOWS_SHUFFLED = 4  # windows whose order is shuffled together (held at once: this many windows of records)


def _streamed_windows(file_pattern: str, kinds: FeatureKinds, heads: list[Head], config: InputConfig,
                      seed: int, rows: Rows = None) -> tf.data.Dataset:
    """The records in windows of `config.shuffle_buffer` (cached serialized when `config.cache`),
    endlessly: the windows' order shuffled a few at a time, each window permuted (stateless, from
    `seed` and the window's position in the stream: the same on every run) and parsed in one call.

    Whole windows, not single records, pass through tf.data: per-record shuffling and one parse
    call per batch cost more than the training step on a small model."""
    windows = record_dataset(file_pattern, config).batch(config.shuffle_buffer)
    if rows is not None:
        windows = windows.map(rows)
    if config.cache:
        windows = windows.cache()
    windows = windows.shuffle(_WINDOWS_SHUFFLED, seed=seed, reshuffle_each_iteration=True).repeat()

    def permute(position, window):
        order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(window)[0]),
                                                         seed=tf.stack([tf.constant(seed, tf.int64), position]))
        return tf.gather(window, order)

    windows = windows.enumerate().map(permute)
    return windows.map(_splitter(kinds, heads), num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic)


def _augmented(dataset: tf.data.Dataset, augment, seed: int, skip_batches: int, config: InputConfig) -> tf.data.Dataset:
    if augment is None:
        return dataset

    def apply(index, batch):
        features, targets = batch
        out = augment(features, targets, tf.stack([tf.constant(seed, tf.int64), index]))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError("augment(features, labels, rng) must return (features, labels)")
        return out

    dataset = dataset.enumerate(start=skip_batches).map(apply, num_parallel_calls=tf.data.AUTOTUNE,
                                                         deterministic=config.deterministic)
    return dataset.prefetch(tf.data.AUTOTUNE)


def make_dataset(
    file_pattern: str,
    kinds: FeatureKinds,
    heads: list[Head],
    batch_size: int,
    config: InputConfig | None = None,
    rows: Rows = None,
) -> tf.data.Dataset:
    """One pass over a split (for evaluation): `(features {name: [batch, 1]}, targets {head: [batch]})`.

    `kinds` must include the label columns; they are split off into targets. `rows`: the records
    taken (e.g. trainer.holdout's validation rows); None: all.
    """
    config = config or InputConfig()
    # Parsed in chunks of whole batches (one parse call each, not one per batch), then cut back
    # into the same batches in the same order.
    chunk = max(_CHUNK // batch_size, 1) * batch_size
    chunks = record_dataset(file_pattern, config).batch(chunk)
    if rows is not None:
        chunks = chunks.map(rows)
    if config.cache:
        chunks = chunks.cache()
    dataset = chunks.map(_splitter(kinds, heads), num_parallel_calls=tf.data.AUTOTUNE).rebatch(batch_size)
    return read_once(_finish(dataset, config))


def eval_dataset(file_pattern: str, kinds: FeatureKinds, heads: list[Head], batch_size: int,
                 config: InputConfig | None = None, columns_dirs: Sequence[str] = ()) -> tf.data.Dataset:
    """make_dataset's pass over a whole split, from the columns handed over with its records in
    one of `columns_dirs` (trainer.handover) where they are there (`handed_over_dataset`)."""
    path = handover.columns_file(columns_dirs, file_pattern, kinds)
    if path is None:
        return make_dataset(file_pattern, kinds, heads, batch_size, config)
    log.info("eval split %s: its columns handed over", file_pattern)
    return handed_over_dataset(path, kinds, heads, batch_size, config)


def handed_over_dataset(path: str, kinds: FeatureKinds, heads: list[Head], batch_size: int,
                        config: InputConfig | None = None, pick: Rows = None) -> tf.data.Dataset:
    """make_dataset's batches from the columns handed over in `path` (handover.columns_file), the
    same batches in the same order, converted block by block instead of parsed, so memory holds a
    block at a time. `pick`: the rows taken, a bool per row of a block's hold-out buckets (as
    trainer.holdout.held_out_buckets answers); None: all."""
    split_labels = _label_splitter(heads)
    # The generator hands NumPy arrays over (tf.data converts a text tensor's every value to a
    # Python object and back); the tensors are made in the map, in parallel.
    def blocks():
        for block in handover.read_blocks(path):
            arrays = handover.block_arrays(block, kinds)
            yield (arrays, block.column(handover.BUCKET).to_numpy()) if pick is not None else arrays

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def batch(arrays, buckets=None):
        columns = handover.column_tensors(arrays, kinds)
        if pick is not None:
            columns = _rows_where(columns, pick(tf.cast(buckets, tf.int64)))
        return split_labels(columns)

    spec = handover.arrays_spec(kinds)
    spec = (spec, tf.TensorSpec([None], tf.int16)) if pick is not None else spec
    dataset = tf.data.Dataset.from_generator(blocks, output_signature=spec)
    dataset = dataset.map(batch, num_parallel_calls=tf.data.AUTOTUNE).rebatch(batch_size)
    return read_once(_finish(dataset, config or InputConfig()))


def handed_over_batches(path: str, kinds: FeatureKinds, pick: Rows = None) -> Iterator[dict[str, tf.Tensor]]:
    """The columns handed over in `path` block by block, as tensors (for statistics, as
    `column_batches`); `pick` as in handed_over_dataset."""
    for block in handover.read_blocks(path):
        columns = handover.to_columns(block, kinds)
        if pick is not None:
            columns = _rows_where(columns, pick(handover.buckets(block)))
        yield columns


def count_picked(path: str, pick: Rows) -> int:
    """How many rows of the columns handed over in `path` `pick` takes (as count_rows counts records)."""
    return sum(int(tf.math.count_nonzero(pick(handover.buckets(block)))) for block in handover.read_blocks(path))


def parsed_batches(file_pattern: str, kinds: FeatureKinds, batch_size: int = 1024, rows: Rows = None):
    """Parsed raw columns (of `rows`) as NumPy, for statistics."""
    dataset = record_dataset(file_pattern).batch(batch_size).map(lambda s: parse_examples(_picked(s, rows), kinds))
    return read_once(dataset).as_numpy_iterator()


def count_rows(file_pattern: str, rows: Rows) -> int:
    """How many records of the split `rows` picks (read and picked, not parsed)."""
    counts = read_once(record_dataset(file_pattern).batch(_CHUNK).map(lambda s: tf.size(rows(s), out_type=tf.int64)))
    return int(counts.reduce(tf.constant(0, tf.int64), lambda total, n: total + n))
