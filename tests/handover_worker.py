"""Trains the same seeded run twice in one process, with and without the columns the CSV
ExampleGen handed over, under MirroredStrategy over two logical CPUs; saves both runs' weights,
final metrics and the replicas' count:
`python -m tests.handover_worker TRAIN EVAL LABEL KINDS_JSON FOLDERS_JSON IN_MEMORY_MB OUT.npz`."""
import json
import logging
import sys

import numpy as np
import tensorflow as tf

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("loopline").setLevel(logging.INFO)  # the Trainer's lines say what it read
    train_pattern, eval_pattern, label, kinds, folders, in_memory_mb, out = sys.argv[1:8]
    cpu = tf.config.list_physical_devices("CPU")[0]  # before TensorFlow initializes its devices
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from trainer.config import TrainerConfig
    from trainer.loop import train

    config = TrainerConfig(strategy="mirrored", epochs=1, max_steps=8, seed=3, deterministic=True, batch_size=256,
                           steps_per_loop=4, tensorboard=False)
    config = config.model_copy(update={"input": config.input.model_copy(update={"in_memory_mb": int(in_memory_mb)})})
    kinds = json.loads(kinds)
    handed = train(config, train_pattern, eval_pattern, label, kinds=kinds, columns_dirs=json.loads(folders))
    parsed = train(config, train_pattern, eval_pattern, label, kinds=kinds)
    np.savez(out, *handed.model.get_weights(), *parsed.model.get_weights(),
             metrics=json.dumps([handed.metrics, parsed.metrics]),
             replicas=tf.distribute.MirroredStrategy().num_replicas_in_sync)
