"""Evaluating an exported SavedModel on the eval split: reading what the export recorded beside it,
and computing the trainer's metrics from its signatures' answers (the blessing: trainer.blessing)."""
from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from typing import Callable, ContextManager, Iterable, Iterator

import numpy as np
import tensorflow as tf

from serving import signature_names as names
from trainer.features import parse_examples
from trainer.heads import CLASSIFICATION, Head, HeadTotals
from trainer.inputs import parsed_chunks, read_once, record_dataset
from trainer.slicing import (BatchSlices, SliceTotals, auc_histograms, calibration_plot_sums, calibration_sums,
                             parse_with_slicing_columns, segment_sums, slice_row_values)


def read_description(saved_model_dir: str) -> dict:
    """What trainer.export recorded beside the SavedModel (features, heads, signature layout)."""
    path = names.signature_file(saved_model_dir)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{saved_model_dir} is not a loopline export: {path} is missing")
    with tf.io.gfile.GFile(path) as f:
        return json.loads(f.read())


def read_signature(saved_model_dir: str) -> tuple[dict[str, str], list[Head]]:
    """The feature kinds and heads recorded at export time."""
    data = read_description(saved_model_dir)
    return data["features"], [Head.from_json(h) for h in data["heads"]]


def prediction_key(heads: list[Head], head: Head) -> str:
    """The `predict_raw` output holding a head's prediction (trainer.export.named_outputs names
    them so), also the layout-1 `serving_default`'s."""
    first = head is heads[0]
    if head.kind == CLASSIFICATION:
        return names.SCORES if first else f"{head.name}_{names.SCORES}"
    return names.OUTPUTS if first else head.name


def evaluation_signature(layout: int, heads: list[Head]) -> tuple[str, dict[str, str]]:
    """The tf.Example signature answering for every head, and each head's output in it: `predict`
    (`<head>_scores`, `<head>_outputs`), or in exports before it (layout 1) `serving_default`."""
    if layout >= 2:
        return names.PREDICT, {h.name: names.head_output(h.name, names.SCORES if h.kind == CLASSIFICATION else names.OUTPUTS)
                               for h in heads}
    return names.DEFAULT, {h.name: prediction_key(heads, h) for h in heads}


def label_kinds(heads: list[Head]) -> dict[str, str]:
    """The label columns to parse (parse_examples keys them by head name)."""
    return {h.label_column: h.label_dtype for h in heads}


def head_metrics(heads: list[Head], predictions: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> dict[str, float]:
    """The trainer's evaluation metrics (HeadTotals) of predictions by head name against the raw
    label columns (`[rows, 1]`, as parse_examples gives them)."""
    totals = HeadTotals(heads)
    totals.add({h.name: h.encode_label(tf.constant(labels[h.name])) for h in heads},
               {h.name: tf.constant(predictions[h.name], tf.float32) for h in heads})
    return totals.metrics()


def read_examples(file_pattern: str, limit: int | None = None) -> list[bytes]:
    """Serialized tf.Examples of a split (GZIP TFRecords), in file order."""
    dataset = record_dataset(file_pattern)
    if limit:
        dataset = dataset.take(limit)
    return list(read_once(dataset).as_numpy_iterator())


# A batch of serialized tf.Examples (a `[rows]` object array of bytes) and its label columns parsed
# (parse_examples' answer, by head name), or None where the model's labels are to be parsed.
Batch = tuple[np.ndarray, dict[str, np.ndarray] | None]


def example_batches(file_pattern: str, batch_size: int, labels: dict[str, str], limit: int | None = None,
                    slicing: dict[str, str] | None = None, preprocessed: Callable | None = None) -> Iterator[Batch]:
    """The split streamed in batches with the `labels` columns (label_kinds) parsed, the next
    batch read while the models run: memory holds a few batches, whatever the split's size.
    `slicing`: the slicing columns' kinds (Slicer.kinds), parsed in the same parse as the labels
    (trainer.slicing.parse_with_slicing_columns: one decoding of each example, not two).
    `preprocessed`: where the labels come from instead of the examples (model_spec.preprocessed_labels)."""
    parsed_labels = {} if preprocessed else labels

    def parse(serialized):
        if slicing:
            parsed = parse_with_slicing_columns(serialized, parsed_labels, slicing)
        else:
            parsed = parse_examples(serialized, parsed_labels) if parsed_labels else {}
        return {**parsed, **preprocessed(serialized)} if preprocessed else parsed

    # parse_examples has no Python control flow on tensors: autograph would only cost a second of tracing.
    parse = tf.autograph.experimental.do_not_convert(parse)
    return ((serialized.numpy(), {k: v.numpy() for k, v in parsed.items()})
            for serialized, parsed in parsed_chunks(file_pattern, batch_size, parse, limit))


# A model's description (read_description's layout) from its SavedModel folder.
Describe = Callable[[str], dict]

# A signature as a function of numpy arrays: {input name: array} in, {output name: array} out.
Call = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
# Opens one signature of a SavedModel (path, signature name; keyword `outputs`: the outputs its
# answers hold, None: all) for the time of a `with` block.
OpenSignature = Callable[..., ContextManager[Call]]


@contextmanager
def eager_signature(saved_model_dir: str, signature: str, outputs: list[str] | None = None) -> Iterator[Call]:
    """The default OpenSignature: the signature's concrete function called eagerly. The Evaluator
    passes the server's Session callable instead (serving.signature_call.signature_caller)."""
    function = tf.saved_model.load(saved_model_dir).signatures[signature]
    yield lambda inputs: {k: v.numpy() for k, v in function(**{n: tf.constant(a) for n, a in inputs.items()}).items()
                          if outputs is None or k in outputs}


class RunningEvaluation:
    """One exported model's metrics (HeadTotals), added batch by batch; its signature is open until
    close(). `heads`: its read_signature heads, when already read. `trivial`: a
    trainer.trivial.TrivialModel scored on the same batches, row by row beside this model.
    `sliced`: also sum its figures per slice (trainer.slicing), in `slices`, when add() is given
    each batch's BatchSlices; `calibration_plot`: the heads summed with them in TFMA's calibration
    plot buckets."""

    def __init__(self, saved_model_dir: str, open_signature: OpenSignature, heads: list[Head] | None = None,
                 trivial=None, describe: Describe = read_description, sliced: bool = False,
                 calibration_plot: frozenset[str] = frozenset()):
        description = describe(saved_model_dir)
        self.heads = heads if heads is not None else [Head.from_json(h) for h in description["heads"]]
        spec = description.get("model_spec")  # a model loopline did not export (trainer.model_spec)
        if spec is None:
            signature, self._keys = evaluation_signature(description.get("layout", 1), self.heads)
        else:
            signature, self._keys = spec["signature"], dict(spec["outputs"])
        self._input = spec["input"] if spec else names.INPUTS
        self._logits_possible = spec is not None
        self.label_kinds = label_kinds(self.heads)
        self._totals = HeadTotals(self.heads)
        self._trivial = trivial
        self.slices = SliceTotals(self.heads) if sliced else None
        self._calibration_plot = [head for head in self.heads if head.name in calibration_plot]
        self._scores = None  # _batch_scores compiled, at the first batch
        # A foreign classifier's reading of its scores (scores_reading), by head: True for logits.
        self.logits: dict[str, bool] = {}
        self._batches = 0
        self._open = ExitStack()
        # Only the outputs scored: a classifier's class names beside its scores are `[rows, classes]` strings.
        outputs = sorted(set(self._keys.values()))
        self._call = self._open.enter_context(open_signature(saved_model_dir, signature, outputs=outputs))

    def close(self) -> None:
        self._open.close()

    def add(self, batch: np.ndarray, labels: dict[str, np.ndarray] | None,
            slices: BatchSlices | None = None) -> dict[str, np.ndarray]:
        """`labels`: the batch's labels parsed by this model's label_kinds, None to parse them here;
        `slices`: the batch's slices (Slicer.batch), summed per slice when this evaluation is sliced.
        Returns the signature's answer."""
        if labels is None:
            labels = parse_examples(tf.constant(batch), self.label_kinds)
        out = self._call({self._input: batch})
        labels = {h.name: tf.convert_to_tensor(labels[h.name]) for h in self.heads}
        outputs = {h.name: tf.convert_to_tensor(out[self._keys[h.name]]) for h in self.heads}
        index = slices.tensors() if slices is not None and self.slices is not None else {}
        if self._logits_possible:
            for h in self.heads:
                if h.kind == CLASSIFICATION:
                    self.logits[h.name] = scores_reading(h.name, outputs[h.name], self.logits.get(h.name), self._batches)
        self._batches += 1
        if self._scores is None:
            self._scores = _compiled(self._batch_scores, labels, outputs, index)
        sums, trivial, per_slice, calibration = self._scores(labels, outputs, index)
        self._totals.add_sums(sums)
        if index:
            self.slices.add(slices.keys, per_slice, calibration)
        if self._trivial is not None:
            self._trivial.add_scores(*trivial)
        return out

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def _batch_scores(self, labels: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor], index: dict[str, tf.Tensor]):
        """One batch's sums (HeadTotals) and the trivial model's beside them, in one graph: eagerly,
        their few dozen small ops per batch cost as much as the model's call. With a slice `index`
        (BatchSlices.tensors), also the sums per slice and the calibration bins."""
        targets = {h.name: h.encode_label(labels[h.name]) for h in self.heads}
        outputs = {name: tf.cast(value, tf.float32) for name, value in outputs.items()}
        if self._logits_possible:  # the reading is fixed before the first trace (scores_reading)
            outputs = {h.name: as_probabilities(outputs[h.name], self.logits[h.name]) if h.kind == CLASSIFICATION
                       else outputs[h.name] for h in self.heads}
        losses = self._totals.row_losses(targets, outputs)
        trivial = self._trivial.batch_scores(targets, losses) if self._trivial is not None else ({}, {})
        if not index:
            return self._totals.batch_sums(targets, outputs, losses), trivial, {}, {}
        rows = self._totals.row_values(targets, outputs, losses)
        sums = {key: tf.reduce_sum(value) for key, value in rows.items()}  # batch_sums, from the same rows
        per_slice = segment_sums({**rows, **slice_row_values(self.heads, targets, outputs, losses)}, index)
        per_slice.update(auc_histograms(self.heads, targets, outputs, losses, index))
        if self._calibration_plot:
            per_slice.update(calibration_plot_sums(self._calibration_plot, targets, outputs, losses, index))
        return sums, trivial, per_slice, calibration_sums(self.heads, targets, outputs, losses)

    @property
    def output_keys(self) -> dict[str, str]:
        """Each head's output in the signature's answer."""
        return dict(self._keys)

    def metrics(self) -> dict[str, float]:
        return self._totals.metrics()


def holds_probabilities(scores) -> bool:
    """Whether a foreign classifier's `[rows, k]` scores can be probabilities: every value in
    [0, 1] and, for k >= 2, every row summing to 1 (a Keras model compiled `from_logits=False`);
    else they are logits (`from_logits=True`, TFX's penguin). One column (a binary classifier's,
    model_spec) is the probability of class 1, or its logit."""
    scores = np.asarray(scores, np.float32)
    in_range = bool(np.all((scores >= 0.0) & (scores <= 1.0)))
    if scores.shape[-1] == 1:
        return in_range
    return in_range and bool(np.all(np.abs(scores.sum(axis=-1) - 1.0) < 1e-3))


def as_probabilities(scores: tf.Tensor, logits: bool) -> tf.Tensor:
    """A foreign classifier's scores as probabilities, read as logits or kept; one column is
    answered as the two classes' `[1 - p, p]`."""
    if scores.shape[-1] == 1:
        p = tf.sigmoid(scores) if logits else scores
        return tf.concat([1.0 - p, p], axis=-1)
    return tf.nn.softmax(scores, axis=-1) if logits else scores


def scores_reading(head: str, scores, logits: bool | None, batch: int) -> bool:
    """Whether a foreign classifier's scores are logits: decided on the first batch (`logits` None)
    and kept for the model. A batch that cannot be probabilities after batches read as such is
    an error: its figures would mix two readings of one output."""
    probabilities = holds_probabilities(scores)
    if logits is None:
        return not probabilities
    if not logits and not probabilities:
        raise ValueError(f"head '{head}': the model's scores were read as probabilities (every value in [0, 1]"
                         f"{', rows summing to 1' if np.shape(scores)[-1] > 1 else ''} in the first batch), but batch "
                         f"{batch + 1} holds scores that are not; a model answering logits must answer some outside "
                         "[0, 1] in its first batch (raise evaluator.batch_size) to be read as logits throughout")
    return logits


def _compiled(function: Callable, *examples: dict[str, tf.Tensor]) -> Callable:
    """`function` as a tf.function for arguments shaped as `examples` with any number of rows:
    traced once, whatever the last batch's size."""
    def spec(value: tf.Tensor) -> tf.TensorSpec:
        return tf.TensorSpec([None, *value.shape[1:]], value.dtype)

    return tf.function(function, input_signature=[{k: spec(v) for k, v in e.items()} for e in examples])


def evaluate_with_champion(candidate_dir: str, champion_dir: str | None, batches: Iterable[Batch],
                           open_signature: OpenSignature = eager_signature, candidate_heads: list[Head] | None = None,
                           champion_heads: list[Head] | None = None, source: str = "the examples",
                           candidate_answers: Callable | None = None, trivial=None,
                           describe: Describe = read_description, slicer=None,
                           slice_totals: dict | None = None,
                           calibration_plot: frozenset[str] = frozenset()) -> tuple[dict[str, float], dict[str, float] | None, str | None]:
    """Candidate and champion on the same batches, in one pass over them: (candidate's metrics,
    champion's metrics or None, why the champion could not be evaluated or None). The candidate's
    failures raise; a champion that fails (to load, or on any batch) drops out with the reason, and
    the candidate's evaluation goes on. `batches`' labels are the candidate's label_kinds (a champion
    parsing its labels otherwise parses its own). `source`: where the batches come from, for the messages.
    `candidate_answers(answer, rows, candidate)`: called with the candidate's answer to each batch
    (the RunningEvaluation last, for its heads and output_keys). `trivial`: a
    trainer.trivial.TrivialModel scored beside the candidate, row by row. `describe`: how a model's
    description is read (trainer.model_spec.describe_model also describes a TFX model).
    `slicer`: a trainer.slicing.Slicer; each batch's slices are found once and summed for both
    models, whose SliceTotals are left in `slice_totals` ("candidate", "champion": None when it
    dropped out); `calibration_plot`: the candidate's heads summed in TFMA's calibration plot buckets."""
    sliced = slicer is not None
    with ExitStack() as stack:
        candidate = RunningEvaluation(candidate_dir, open_signature, candidate_heads, trivial, describe, sliced,
                                      calibration_plot)
        stack.callback(candidate.close)
        champion, problem = None, None
        if champion_dir is not None:
            try:
                champion = RunningEvaluation(champion_dir, open_signature, champion_heads, describe=describe, sliced=sliced)
                stack.callback(champion.close)
            except Exception as exc:  # noqa: BLE001 - the blessing refuses the candidate unless allowed
                problem = f"{champion_dir} could not be evaluated ({_first_line(exc)})"
        rows = 0
        for batch, labels in batches:
            slices = slicer.batch(batch, labels) if sliced else None
            answer = candidate.add(batch, labels, slices)
            if candidate_answers is not None:
                candidate_answers(answer, len(batch), candidate)
            if champion is not None:
                try:
                    champion.add(batch, labels if champion.label_kinds == candidate.label_kinds else None, slices)
                except Exception as exc:  # noqa: BLE001 - as above
                    problem = (f"{champion_dir} could not be evaluated on examples {rows}-{rows + len(batch) - 1} "
                               f"of {source} ({_first_line(exc)})")
                    champion.close()  # its memory back now, not at the end of the pass
                    champion = None
            rows += len(batch)
        if rows == 0:
            raise ValueError(f"no eval examples in {source}")
        if slice_totals is not None:
            slice_totals.update(candidate=candidate.slices, champion=champion.slices if champion is not None else None)
        return candidate.metrics(), champion.metrics() if champion is not None else None, problem


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def evaluate_saved_model(saved_model_dir: str, examples: list[bytes], batch_size: int = 256,
                         heads: list[Head] | None = None, open_signature: OpenSignature = eager_signature) -> dict[str, float]:
    """Metrics of an exported model, computed from its `predict` answers (`serving_default`'s
    for exports before it) on serialized eval examples (`read_examples`). `heads`: its
    read_signature heads, when already read."""
    batches = ((np.array(examples[start:start + batch_size], dtype=object), None) for start in range(0, len(examples), batch_size))
    return evaluate_with_champion(saved_model_dir, None, batches, open_signature, heads)[0]


def is_loopline_export(saved_model_dir: str) -> bool:
    return tf.io.gfile.exists(names.signature_file(saved_model_dir))
