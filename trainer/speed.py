"""Resolving the speed settings: `jit_compile` and `steps_per_loop` are "auto" by default, which
picks the fast settings where they are safe and falls back (logged) where they are not; an
explicit value that cannot apply is refused, naming the key."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from trainer.config import AUTO_STEPS_PER_LOOP, TrainerConfig

log = logging.getLogger("loopline.trainer")

# On CPU, a step whose matmuls dominate ran faster without XLA: the train bench's 4 x 1024 MLP
# (4.9 GFLOP of Dense layers per step at batch 256) did ~26% more examples per second, with the
# same FLOPs per CPU-second (XLA's step kept the two cores less busy). A step of many small ops
# runs faster with XLA (it fuses them into few calls): ~1.5x at 0.03 GFLOP per step (the
# 16-128-128 MLP); from 0.1 to 1.7 GFLOP the two were even. "auto" turns XLA off on CPU from
# this many FLOPs per step in Dense layers (trainer.flops), with oneDNN on (TensorFlow's default).
XLA_CPU_MAX_DENSE_FLOPS = 10**9
# On CPU, XLA's compile of the step costs about a CPU second at the first call (0.7-1.3 s more than
# without it: the penguins model and the 16-128-128 MLP at 32 steps per call), and its steps were
# 0.12-0.21 CPU ms faster where they were faster at all (the penguins model on the train bench's
# rows; the MLP's were not, nor the penguins model's on the scale bench's 1M rows). At those
# figures the compile pays for itself after about 6,000 steps: "auto" keeps XLA off on CPU for a
# run of fewer steps than this.
XLA_CPU_MIN_STEPS = 6_000


@dataclass(frozen=True)
class Speed:
    jit_compile: bool
    steps_per_loop: int


def onednn_on() -> bool:
    """TensorFlow's oneDNN kernels: on unless TF_ENABLE_ONEDNN_OPTS turns them off."""
    return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").strip().lower() not in ("0", "false")


def _jit_blockers(config: TrainerConfig, replicas: int, custom_step: bool, cpu_dense_flops: int | None,
                  total_steps: int | None) -> list[str]:
    """Why XLA would not be safe, or not faster, here (empty: it is both)."""
    reasons = []
    if cpu_dense_flops is not None and cpu_dense_flops >= XLA_CPU_MAX_DENSE_FLOPS and onednn_on():
        reasons.append(f"on CPU the step's Dense layers take {cpu_dense_flops / 1e9:.2g} GFLOP, where TensorFlow's "
                       "own oneDNN kernels train faster (trainer.jit_compile=true forces XLA)")
    if replicas > 1:
        reasons.append(f"{replicas} replicas (the step all-reduces inside the compiled function)")
    if config.debug:
        reasons.append("trainer.debug runs the step eagerly")
    if custom_step:
        reasons.append("the module's own train_step may hold ops XLA cannot compile")
    if config.deterministic:
        reasons.append("trainer.deterministic: some ops have no deterministic XLA kernel (e.g. MaxPool's gradient)")
    if cpu_dense_flops is not None and total_steps is not None and total_steps < XLA_CPU_MIN_STEPS:
        reasons.append(f"on CPU a run of {total_steps} steps is too short to pay back XLA's compile of about a CPU "
                       f"second, used from {XLA_CPU_MIN_STEPS} steps (trainer.jit_compile=true forces XLA)")
    return reasons


def resolve_speed(config: TrainerConfig, replicas: int, on_cpu: bool, custom_step: bool, steps_per_epoch: int,
                  cpu_dense_flops: int | None = None, total_steps: int | None = None) -> Speed:
    """The settings this run uses. `on_cpu`: the replicas are CPU devices. `cpu_dense_flops`: on
    CPU, the training FLOPs of one step in the model's Dense layers (None: not on CPU).
    `total_steps`: the run's steps (None: not weighed)."""
    if config.jit_compile is True:
        if replicas > 1 and on_cpu:
            # The step all-reduces gradients inside the compiled function; XLA has no collectives on CPU.
            raise ValueError(f"trainer.jit_compile does not work with {replicas} replicas on CPU (strategy "
                             f"{config.strategy}: XLA has no cross-replica collectives on CPU); set "
                             "trainer.jit_compile=false or train on one device")
        if config.debug:
            raise ValueError("trainer.jit_compile=true cannot apply with trainer.debug=true (the step runs eagerly); "
                             "set trainer.jit_compile to false or auto")
        jit = True
    elif config.jit_compile == "auto":
        blockers = _jit_blockers(config, replicas, custom_step, cpu_dense_flops, total_steps)
        jit = not blockers
        if blockers:
            log.info("trainer.jit_compile=auto: XLA off (%s)", "; ".join(blockers))
    else:
        jit = False
    if config.steps_per_loop == "auto":
        steps = 1 if config.debug else min(AUTO_STEPS_PER_LOOP, steps_per_epoch)
    else:
        steps = config.steps_per_loop
    log.info("speed: jit_compile=%s (%s), steps_per_loop=%d (%s)", jit, config.jit_compile, steps, config.steps_per_loop)
    return Speed(jit, steps)
