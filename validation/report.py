"""A human view of statistics and anomalies: one HTML page plus a PNG histogram per feature
(splits overlaid, and the baseline's splits when there is one, with the drift figures and the
schema changes), written from the protos alone."""
from __future__ import annotations

import html
import io
import os
import re
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2  # noqa: E402

from validation.anomalies import Problem  # noqa: E402
from validation.statistics import common_stats  # noqa: E402

FNS = statistics_pb2.FeatureNameStatistics


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _plot(feature: str, per_split: dict[str, FNS], path: str) -> None:
    fig, ax = plt.subplots(figsize=(5, 3))
    numeric = all(f.type in (FNS.INT, FNS.FLOAT) for f in per_split.values())
    # Categories: the 15 most frequent over all series, one bar per series side by side.
    shares = {split: {b.label: b.sample_count for b in stats.string_stats.rank_histogram.buckets}
              for split, stats in per_split.items()}
    totals = {split: sum(counts.values()) or 1.0 for split, counts in shares.items()}
    labels = sorted({v for c in shares.values() for v in c},
                    key=lambda v: -sum(c.get(v, 0.0) / totals[s] for s, c in shares.items()))[:15]
    for k, (split, stats) in enumerate(per_split.items()):
        if numeric:
            buckets = [b for h in stats.num_stats.histograms if h.type == statistics_pb2.Histogram.STANDARD for b in h.buckets]
            total = sum(b.sample_count for b in buckets) or 1.0
            ax.stairs([b.sample_count / total for b in buckets],
                      [buckets[0].low_value] + [b.high_value for b in buckets] if buckets else [0.0], label=split)
        else:
            height = 0.8 / len(per_split)
            ax.barh([i - 0.4 + height * (k + 0.5) for i in range(len(labels))],
                    [shares[split].get(v, 0.0) / totals[split] for v in labels], height=height, label=split)
    if not numeric:
        ax.set_yticks(range(len(labels)), [v[:20] for v in labels])
    ax.set_title(feature)
    ax.set_xlabel("fraction" if not numeric else feature)
    ax.legend(fontsize=7)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=80)
    plt.close(fig)
    with tf.io.gfile.GFile(path, "wb") as f:  # the report folder may be on gs://...
        f.write(image.getvalue())


def _summary(stats: FNS, num_examples: int) -> str:
    common = common_stats(stats)
    missing = common.num_missing / num_examples if num_examples else 0.0
    if stats.type in (FNS.INT, FNS.FLOAT):
        n = stats.num_stats
        return f"missing {missing:.1%}; mean {n.mean:.4g}, std {n.std_dev:.4g}, min {n.min:.4g}, median {n.median:.4g}, max {n.max:.4g}"
    if stats.HasField("bytes_stats"):  # encoded images
        b = stats.bytes_stats
        return (f"missing {missing:.1%}; images, {b.unique} distinct; bytes min {b.min_num_bytes:g}, "
                f"avg {b.avg_num_bytes:.4g}, max {b.max_num_bytes:g}")
    s = stats.string_stats
    top = ", ".join(f"{v.value} ({v.frequency:g})" for v in s.top_values[:5])
    return f"missing {missing:.1%}; {s.unique} distinct; top: {top}"


@dataclass
class BaselineView:
    """The baseline a run was checked against, for the report."""
    description: str
    stats_by_split: dict[str, statistics_pb2.DatasetFeatureStatistics]
    drift: dict[tuple[str, str], tuple[str, float, float]]  # (split, feature) -> (measure, value, threshold)
    schema_changes: list[str]


def _drift_cell(name: str, baseline: BaselineView | None) -> str:
    if baseline is None:
        return ""
    cells = []
    for (split, feature), (measure, value, threshold) in sorted(baseline.drift.items()):
        if feature == name:
            mark = "&gt;" if value > threshold else "&le;"
            cells.append(f"<b>{html.escape(split)}</b>: {measure} {value:.3f} {mark} {threshold:g}")
    return "<br>".join(cells) or "not compared"


def _feature_row(name: str, runs: dict, schema_type: str, problems: list[Problem], baseline: BaselineView | None,
                 out_dir: str) -> str:
    """One feature's table row: its statistics per split, its problems, its drift, its plot."""
    per_split = {split: f for split, s in runs.items() for f in s.features if f.name == name}
    image = f"{_safe(name)}.png"
    _plot(name, per_split, os.path.join(out_dir, image))
    details = "<br>".join(
        f"<b>{html.escape(split)}</b>: {html.escape(_summary(f, runs[split].num_examples))}"
        for split, f in per_split.items()
    )
    found = [p for p in problems if p.feature == name]
    flags = "<br>".join(f"<b>[{html.escape(p.split)}]</b> {html.escape(p.description)}" for p in found) or "ok"
    css = ' class="bad"' if found else ""
    drift = f"<td>{_drift_cell(name, baseline)}</td>" if baseline is not None else ""
    return (f"<tr{css}><td>{html.escape(name)}</td><td>{schema_type}</td>"
            f"<td>{details}</td><td>{flags}</td>{drift}<td><img src=\"{image}\" alt=\"{html.escape(name)}\"></td></tr>")


def _baseline_section(baseline: BaselineView | None) -> str:
    if baseline is None:
        return "<p>No baseline: nothing to compare with (the first run on this root).</p>"
    listed = "".join(f"<li><code>{html.escape(line)}</code></li>" for line in baseline.schema_changes)
    return (f"<p>{html.escape(baseline.description)}.</p><h2>Schema changes against the baseline</h2>"
            + (f"<ul>{listed}</ul>" if listed else "<p>none</p>"))


def write_report(
    out_dir: str,
    stats_by_split: dict[str, statistics_pb2.DatasetFeatureStatistics],
    schema: schema_pb2.Schema | None,
    problems: list[Problem],
    baseline: BaselineView | None = None,
) -> str:
    """Writes `<out_dir>/index.html` and `<out_dir>/<feature>.png`; returns the page's path. With
    a baseline, its splits are drawn over the run's, with the drift figures and schema changes."""
    tf.io.gfile.makedirs(out_dir)  # the report folder may be on gs://...
    base_stats = baseline.stats_by_split if baseline is not None else {}
    features = sorted({f.name for s in [*stats_by_split.values(), *base_stats.values()] for f in s.features})
    types = {f.name: schema_pb2.FeatureType.Name(f.type) for f in schema.feature} if schema is not None else {}
    runs = {**stats_by_split, **{f"baseline {split}": s for split, s in base_stats.items()}}
    rows = [_feature_row(name, runs, types.get(name, "(not in schema)"), problems, baseline, out_dir) for name in features]
    header_drift = "<th>drift against the baseline</th>" if baseline is not None else ""
    changes = _baseline_section(baseline)
    dataset_problems = "".join(f"<li>[{html.escape(p.split)}] {html.escape(p.description)}</li>"
                               for p in problems if p.feature not in features)
    counts = ", ".join(f"{split}: {s.num_examples} examples" for split, s in stats_by_split.items())
    verdict = f"{len(problems)} anomalies" if problems else "no anomalies"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>loopline data report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px;vertical-align:top;font-size:13px}} tr.bad td{{background:#fde8e8}}</style>
</head><body>
<h1>Data report</h1>
<p>{html.escape(counts)}. <b>{verdict}</b>.</p>
{f"<ul>{dataset_problems}</ul>" if dataset_problems else ""}
{changes}
<table><tr><th>feature</th><th>schema type</th><th>statistics</th><th>anomalies</th>{header_drift}<th>distribution</th></tr>
{"".join(rows)}
</table></body></html>
"""
    path = os.path.join(out_dir, "index.html")
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(page)
    return path
