"""Checkpoints: everything needed to continue a run exactly — models, optimizers (with EMA and
loss scale), the step, the number of batches consumed (the position in the data) and the RNG."""
from __future__ import annotations

import logging
import os
import time

import tensorflow as tf

from trainer.summaries import progress_log

log = logging.getLogger("loopline.trainer")


class Checkpoints:
    def __init__(self, directory: str | None, keep: int, every_steps: int | None, chief: bool = True,
                 task: str = "worker", **trackables):
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.every_steps = every_steps
        self.manager = None
        self.chief_directory = directory
        self.keep = keep
        if directory:
            if not chief:  # other workers must save too (collectives), but somewhere private: per
                # task (TF_CONFIG's type and index), so a restarted worker finds its copy again
                directory = os.path.join(directory, f"worker-tmp-{task}")
            self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep)

    def start(self, resume: bool, step_variable) -> int:
        """The step the run starts at: the latest checkpoint's when resuming; otherwise 0, with
        any old checkpoints moved aside (kept, not deleted, and never read by this run)."""
        if resume:
            return self.restore_latest(step_variable)
        self.set_aside()
        return 0

    def set_aside(self) -> str | None:
        """Moves the checkpoint folder to `<folder>-set-aside-<UTC time>`; returns where (None: nothing to move)."""
        if self.manager is None or self.manager.latest_checkpoint is None:
            return None
        directory = self.manager.directory
        aside = f"{directory}-set-aside-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        suffix = 1
        while tf.io.gfile.exists(aside if suffix == 1 else f"{aside}-{suffix}"):
            suffix += 1
        aside = aside if suffix == 1 else f"{aside}-{suffix}"
        tf.io.gfile.rename(directory, aside)
        log.warning("trainer.resume is false: moved the old checkpoints (latest %s) aside to %s; starting at step 0",
                    os.path.basename(self.manager.latest_checkpoint), aside)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=self.keep)
        return aside

    def restore_latest(self, step_variable) -> int:
        """Restores the newest checkpoint if there is one; returns the step it holds (0 if none).

        Every worker resumes from the chief's newest checkpoint (a TFJob's work dir is shared
        storage), so all resume at the same step even when a worker died between the chief's save
        and its own; a worker's own copy is the fallback when it cannot see the chief's."""
        if self.manager is None:
            return 0
        latest = tf.train.latest_checkpoint(self.chief_directory) or self.manager.latest_checkpoint
        if latest is None:
            return 0
        self.checkpoint.restore(latest).expect_partial()
        step = int(step_variable.numpy())
        progress_log.info("resumed from step %d (%s)", step, latest)  # on the terminal: not a fresh start
        return step

    def save(self, step: int) -> str | None:
        if self.manager is None:
            return None
        return self.manager.save(checkpoint_number=step)

    def due(self, step: int) -> bool:
        return bool(self.manager and self.every_steps and step % self.every_steps == 0)
