"""Resolving the speed settings: `jit_compile` and `steps_per_loop` are "auto" by default, which
picks the fast settings where they are safe and falls back (logged) where they are not; an
explicit value that cannot apply is refused, naming the key."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from trainer.config import AUTO_STEPS_PER_LOOP, TrainerConfig

log = logging.getLogger("loopline.trainer")


@dataclass(frozen=True)
class Speed:
    jit_compile: bool
    steps_per_loop: int


def _jit_blockers(config: TrainerConfig, replicas: int, custom_step: bool) -> list[str]:
    """Why XLA would not be safe here (empty: it is)."""
    reasons = []
    if replicas > 1:
        reasons.append(f"{replicas} replicas (the step all-reduces inside the compiled function)")
    if config.debug:
        reasons.append("trainer.debug runs the step eagerly")
    if custom_step:
        reasons.append("the module's own train_step may hold ops XLA cannot compile")
    if config.deterministic:
        reasons.append("trainer.deterministic: some ops have no deterministic XLA kernel (e.g. MaxPool's gradient)")
    return reasons


def resolve_speed(config: TrainerConfig, replicas: int, on_cpu: bool, custom_step: bool, steps_per_epoch: int) -> Speed:
    """The settings this run uses. `on_cpu`: the replicas are CPU devices."""
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
        blockers = _jit_blockers(config, replicas, custom_step)
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
