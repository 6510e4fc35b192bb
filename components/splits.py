"""Where an Examples artifact keeps a split's files."""
import os

from tfx.types import artifact_utils

TRAIN_SPLIT = "train"  # the split the Trainer trains on
EVAL_SPLIT = "eval"  # the split the Trainer and the Evaluator evaluate on
COLUMNS_FOLDER = "handed_over_columns"  # in the Examples artifact: Split-<name>/, beside the Split-* folders stock readers glob


def split_pattern(examples, split: str) -> str:
    """The file pattern of one split of an Examples artifact (ExampleGen writes one folder per split)."""
    return os.path.join(artifact_utils.get_split_uri([examples], split), "*")


def columns_dir(examples_uri: str, split: str) -> str:
    """Where the CSV ExampleGen hands over a split's columns with its records (trainer.handover)."""
    return os.path.join(examples_uri, COLUMNS_FOLDER, f"Split-{split}")
