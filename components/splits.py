"""Where an Examples artifact keeps a split's files."""
import os

from tfx.types import artifact_utils


def split_pattern(examples, split: str) -> str:
    """The file pattern of one split of an Examples artifact (ExampleGen writes one folder per split)."""
    return os.path.join(artifact_utils.get_split_uri([examples], split), "*")
