"""`loopline serve` with the model's call answered from a cache: what our server costs around the
model (gRPC, parsing, checks, batching, the response, metrics) against the no-model floor.

Each signature's first call with given input shapes runs the model; later calls with the same
shapes get its outputs back without running it. Only for the serving bench, whose clients send
the same row every time, so every answer is the model's own.

    python -m bench.cached_answer_server serve ...   (the arguments of `loopline serve`)
"""
from __future__ import annotations

import sys


def cache_model_answers() -> None:
    """Makes Servable._call (the model's call behind batching) answer from a cache, kept per
    servable, signature and input shapes."""
    from serving.servable import Servable

    call = Servable._call

    def cached(self, key, inputs):
        shapes = (key, *((name, array.shape) for name, array in sorted(inputs.items())))
        answers = self.__dict__.setdefault("_cached_answers", {})
        if shapes not in answers:
            answers[shapes] = call(self, key, inputs)
        return answers[shapes]

    Servable._call = cached


def _after_process_setup(prepare):
    """The serving process is set up first (oneDNN, CPU pinning: before TensorFlow is imported)."""
    def prepare_then_cache(*args, **kwargs):
        prepare(*args, **kwargs)
        cache_model_answers()

    return prepare_then_cache


if __name__ == "__main__":
    from pipeline import cli

    cli._prepare_serving_process = _after_process_setup(cli._prepare_serving_process)  # noqa: SLF001
    sys.exit(cli.main())
