"""Runs one small training in its own process and saves the final weights:
`python -m tests.trainer_worker STRATEGY TRAIN EVAL OUT.npz [LOGICAL_CPUS [CONFIG_JSON]]`."""
import json
import sys

import numpy as np
import tensorflow as tf

if __name__ == "__main__":
    strategy, train_path, eval_path, out = sys.argv[1:5]
    if len(sys.argv) > 5:  # before TensorFlow initializes its devices
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * int(sys.argv[5]))
    from trainer.config import TrainerConfig
    from trainer.loop import train

    config = TrainerConfig(strategy=strategy, epochs=1, batch_size=32, seed=11, deterministic=True,
                           steps_per_loop=4, clip_norm=5.0, nan_policy="skip", lr_multipliers={"hidden_0": 0.5},
                           tensorboard=False)
    if len(sys.argv) > 6:
        config = config.model_copy(update=json.loads(sys.argv[6]))
    result = train(config, train_path, eval_path, "target")
    np.savez(out, *result.model.get_weights(), steps=result.steps)
