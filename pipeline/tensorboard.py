"""`loopline tensorboard`: TensorBoard on the newest Trainer run's summaries, bound to loopback
unless told otherwise."""
from __future__ import annotations

import os
import time

import tensorflow as tf

# Where the trainer writes `tensorboard/{train,eval}`: the pipeline's Trainer (its ModelRun
# artifact, `<pipeline.root>/tfx/<component>/<output>/<execution id>`) and `loopline train` (its
# work folder), both under pipeline.root.
TRAINER_LOGS = ("tfx/Trainer/model_run/*/tensorboard", "train/*/tensorboard")


def newest_logdir(root: str) -> str:
    """The Trainer run under `root` whose event files were written last."""
    candidates = []
    for pattern in TRAINER_LOGS:
        for folder in tf.io.gfile.glob(os.path.join(root, pattern)):
            events = tf.io.gfile.glob(os.path.join(folder, "*", "events.out.tfevents.*"))
            if events:
                candidates.append((max(tf.io.gfile.stat(e).mtime_nsec for e in events), folder))
    if not candidates:
        raise FileNotFoundError(f"no Trainer TensorBoard logs under {root} (looked for {', '.join(TRAINER_LOGS)}); "
                                "run the pipeline or `loopline train` first, or pass --logdir")
    return max(candidates)[1]


def tensorboard_argv(logdir: str, host: str, port: int) -> list[str]:
    """TensorBoard's own flags (argv[0] is its program name)."""
    return ["tensorboard", "--logdir", logdir, "--host", host, "--port", str(port)]


def serve(logdir: str, host: str = "127.0.0.1", port: int = 6006) -> None:
    """Serves until interrupted; prints the address (port 0: a free one)."""
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=tensorboard_argv(logdir, host, port))
    url = board.launch()
    print(f"TensorBoard at {url} on {logdir} (Ctrl-C stops it)", flush=True)
    while True:
        time.sleep(3600)
