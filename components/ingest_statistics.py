"""Statistics computed while the examples are written, so that StatisticsGen need not read them back.

The CSV ExampleGen summarizes each block of rows as it encodes it, from the same typed values and in
the layout tfx-bsl's decoder gives the written examples (csv_records.encode_with_columns), merges the
summaries per split and leaves the statistics in its Examples artifact (STATISTICS_FOLDER, beside the
Split-* folders, which stock readers glob), with the name and size of every file it wrote. StatisticsGen
takes a split's statistics from there when the split's folder holds exactly those files, and reads the
examples otherwise (another ExampleGen, an artifact written before this existed, files changed since).

The exact figures (counts, missing, min, max, mean, deviation, zeros, lengths, distinct values up to
UNIQUE_BUCKETS, top values up to RANK_BUCKETS) are those a read-back gives. Sketched ones (quantiles and
histograms; top values of a feature with more distinct values) depend on the order values reach the
sketch, so they can differ from a read-back's within the sketches' error bounds, as they do when Beam
splits a read-back over workers.
"""
from __future__ import annotations

import json
import logging
import os

from tfx.dsl.io import fileio
from tfx.types import artifact_utils

STATISTICS_FOLDER = "ingest_statistics"  # in the Examples artifact: Split-<name>/FeatureStats.pb and FILES
FILES = "files.json"  # {split: {file name: size in bytes}} of the examples the statistics describe

log = logging.getLogger("loopline")


def statistics_dir(examples_uri: str, split: str) -> str:
    return os.path.join(examples_uri, STATISTICS_FOLDER, f"Split-{split}")


def write_split_statistics(stats, examples_uri: str, split: str) -> None:
    from validation.statistics import write_statistics

    write_statistics(statistics_dir(examples_uri, split), stats)


def _files(split_dir: str) -> dict[str, int]:
    return {name: fileio.stat(os.path.join(split_dir, name)).length for name in sorted(fileio.listdir(split_dir))}


def record_files(examples) -> None:
    """After the examples and their statistics are written: what each split's folder holds."""
    splits = artifact_utils.decode_split_names(examples.split_names)
    listing = {split: _files(artifact_utils.get_split_uri([examples], split)) for split in splits}
    with fileio.open(os.path.join(examples.uri, STATISTICS_FOLDER, FILES), "w") as f:
        f.write(json.dumps(listing, indent=1, sort_keys=True))


def recorded_statistics(examples, split: str):
    """The statistics the ExampleGen recorded for `split` when its folder holds exactly the files
    they describe; else None (the examples are then read)."""
    from validation.statistics import STATS_FILE, read_statistics

    listing_path = os.path.join(examples.uri, STATISTICS_FOLDER, FILES)
    stats_dir = statistics_dir(examples.uri, split)
    if not fileio.exists(listing_path) or not fileio.exists(os.path.join(stats_dir, STATS_FILE)):
        return None
    with fileio.open(listing_path) as f:
        recorded = json.loads(f.read()).get(split)
    found = _files(artifact_utils.get_split_uri([examples], split))
    if recorded != found:
        log.warning("split '%s': its files are not those the ExampleGen summarized; reading them for statistics", split)
        return None
    return read_statistics(stats_dir)
