"""Renders a model card's content (tracking.model_card.card_content) as files: an HTML page
(jinja2, every value from the data escaped), the same in Markdown, the content as JSON, and PNG
pictures made with matplotlib (training curves, calibration) that both pages link to."""
from __future__ import annotations

import html
import io
import json

import jinja2
# Figures made directly, not through pyplot: no global figure state, and no pyplot import (which
# asks IPython for its display hook, a package `loopline run` keeps deferred).
from matplotlib.figure import Figure

CURVES_PNG = "training_curves.png"
CALIBRATION_PNG = "calibration.png"
MAX_PANELS = 6


def _png(fig) -> bytes:
    image = io.BytesIO()
    fig.tight_layout()
    fig.savefig(image, format="png", dpi=90)
    return image.getvalue()


def curves_png(curves: dict[str, list]) -> bytes | None:
    """The loss as trained beside the eval loss, then each eval metric, one panel each."""
    if not curves:
        return None
    panels: list[tuple[str, list[str]]] = []
    losses = [k for k in ("train/loss", "eval/loss") if k in curves]
    if losses:
        panels.append(("loss", losses))
    panels += [(k.split("/", 1)[1], [k]) for k in curves if k.startswith("eval/") and k != "eval/loss"]
    panels = panels[:MAX_PANELS]
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(4 * columns, 2.8 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, names) in zip(axes.flat, panels):
        for name in names:
            steps, values = zip(*curves[name])
            ax.plot(steps, values, marker=".", label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if len(names) > 1:
            ax.legend(fontsize=7)
    return _png(fig)


def calibration_png(calibration: dict[str, list] | None) -> bytes | None:
    """Observed frequency against the mean predicted probability per bin, per head; the diagonal
    is a perfectly calibrated model; a marker's area grows with its bin's examples."""
    if not calibration:
        return None
    fig = Figure(figsize=(4.5, 4))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect")
    for head, bins in calibration.items():
        bins = [b for b in bins if b.get("examples")]
        if not bins:
            continue
        most = max(b["examples"] for b in bins)
        ax.plot([b["mean_prediction"] for b in bins], [b["observed"] for b in bins], marker=None, label=head)
        ax.scatter([b["mean_prediction"] for b in bins], [b["observed"] for b in bins],
                   s=[10 + 90 * b["examples"] / most for b in bins])
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("mean predicted probability", fontsize=8)
    ax.set_ylabel("observed frequency", fontsize=8)
    ax.set_title("calibration (eval split)", fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def number(value) -> str:
    """A figure as the card shows it."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    return str(value)


def metric_names(slices: dict) -> list[str]:
    """The slice table's metric columns: the counts are its `examples` column already."""
    names = {k for s in slices.get("slices", []) for k in (s.get("candidate") or {}) if not k.endswith("_examples")}
    return sorted(names)


def render_card(content: dict) -> dict[str, bytes]:
    """{file name: bytes} of the card."""
    files: dict[str, bytes] = {}
    curves = curves_png(content.get("curves") or {})
    if curves:
        files[CURVES_PNG] = curves
    calibration = calibration_png((content.get("slices") or {}).get("calibration"))
    if calibration:
        files[CALIBRATION_PNG] = calibration
    view = {**content, "images": {"curves": CURVES_PNG if curves else None,
                                  "calibration": CALIBRATION_PNG if calibration else None},
            "metric_names": metric_names(content["slices"]) if content.get("slices") else []}
    from tracking.model_card import CARD_HTML, CARD_JSON, CARD_MD

    files[CARD_HTML] = _environment().from_string(HTML).render(**view).encode("utf-8")
    files[CARD_MD] = markdown(view).encode("utf-8")
    files[CARD_JSON] = (json.dumps(content, indent=2, default=str) + "\n").encode("utf-8")
    return files


def _environment() -> jinja2.Environment:
    # Missing keys render empty (slices.json from older Evaluators may lack some); autoescape: any
    # value may come from the data (a feature value, a file name).
    env = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["number"] = number
    env.globals.update(lineage_rows=lineage_rows, blessing_rows=blessing_rows, tflite_rows=tflite_rows)
    return env


def cell(value) -> str:
    """A Markdown table cell: escaped for HTML (Markdown passes HTML through: <, > and &; quotes
    only matter inside a tag, and escaped they would show as &#x27; in the file) and for the table."""
    return html.escape(number(value), quote=False).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows] + [""]


def markdown(view: dict) -> str:
    """The card in Markdown, section for section as the HTML page."""
    lineage, blessing = view["lineage"], view.get("blessing") or {}
    out = [f"# Model card: {cell(view['title'])}", "", f"Generated {cell(view['generated_at'])}.", "",
           "## Lineage", ""]
    out += _md_table(["", ""], lineage_rows(lineage))
    out += _md_table(["data file", "sha256", "bytes"], [[f["path"], f["sha256"], f["bytes"]]
                                                        for f in lineage["data"]["files"]])
    verdict = "blessed" if blessing.get("blessed") else "NOT blessed" if blessing else "no blessing recorded"
    out += ["## Blessing", "", f"**{verdict}**", ""] + [f"- {cell(r)}" for r in blessing.get("reasons", [])] + [""]
    out += _md_table(["metric", "candidate", "champion", "trivial model"], blessing_rows(blessing))
    out += ["## Slices", ""]
    slices = view.get("slices")
    if not slices:
        out += ["No slices were computed for this version (its blessing has no slices.json).", ""]
    else:
        names = view["metric_names"]
        out += _md_table(["slice", "examples", "gated", *names],
                         [[s["slice"], s.get("examples"), s.get("gated"),
                           *(_with_champion(s, n) for n in names)] for s in slices.get("slices", [])])
        out += _md_table(["slice", "metric", "candidate", "champion", "bound", "passed"],
                         [[g.get("slice"), g.get("metric"), g.get("candidate"), g.get("champion"), g.get("bound"),
                           g.get("passed")] for g in slices.get("gates", [])])
    images = view["images"]
    out += ["## Training curves", "", f"![training curves]({images['curves']})" if images["curves"]
            else "No training curves (no MLflow metric history, no TensorBoard files).", "", "## Calibration", "",
            f"![calibration]({images['calibration']})" if images["calibration"] else "No calibration computed.", ""]
    out += ["## TFLite variants and parity", ""]
    out += _md_table(["variant", "bytes", "max abs diff", "metric delta", "latency ms", "parity"],
                     tflite_rows(view.get("export")))
    out += ["## Known limits", ""] + [f"- {cell(line)}" for line in view["limits"]] + [""]
    return "\n".join(out)


def _with_champion(entry: dict, name: str) -> str:
    """A slice's metric, and the champion's on the same slice where it has one."""
    value, champion = (entry.get("candidate") or {}).get(name), (entry.get("champion") or {}).get(name)
    return number(value) + (f" (champion {number(champion)})" if champion is not None else "")


def lineage_rows(lineage: dict) -> list[list]:
    """(what, value) rows of the lineage table, shared by both pages."""
    mlflow, baseline = lineage.get("mlflow") or {}, lineage.get("data_baseline") or {}
    champion, stats = lineage.get("champion_replaced"), lineage.get("statistics") or {}
    data = lineage["data"]
    return [
        ["pushed to", (lineage.get("pushed") or {}).get("path")],
        ["pipeline run", f"{lineage['pipeline']['name']} {lineage['pipeline']['run_id']}"],
        ["data", f"{data['count']} file(s), combined sha256 {data['combined_sha256']}"],
        ["examples", (data.get("examples") or {}).get("uri")],
        ["statistics", f"{stats.get('uri')} ({', '.join(f'{k}: {v}' for k, v in (stats.get('examples') or {}).items())})"],
        ["data baseline", baseline.get("description") or "(not recorded)"],
        ["model", (lineage.get("model_artifact") or {}).get("uri")],
        ["git commit", lineage.get("git_commit") or "(not recorded)"],
        ["MLflow run", mlflow.get("error") or mlflow.get("run_id") or "(none)"],
        ["registered version", f"{mlflow.get('registered_model')} {mlflow.get('registered_version')}"
         if mlflow.get("registered_version") else "(none)"],
        ["champion replaced", f"version {champion['version']} ({champion['path']})" if champion
         else "none (first model)"],
    ]


def blessing_rows(blessing: dict) -> list[list]:
    candidate, champion = blessing.get("candidate") or {}, blessing.get("champion") or {}
    trivial = blessing.get("trivial") or {}
    return [[k, candidate.get(k), champion.get(k), trivial.get(k)] for k in sorted(candidate)]


def tflite_rows(export: dict | None) -> list[list]:
    rows = []
    for v in (export or {}).get("tflite", []):
        diff = ", ".join(f"{k} {number(x)}" for k, x in (v.get("max_abs_diff") or {}).items())
        delta = ", ".join(f"{k} {number(x)}" for k, x in (v.get("metric_delta") or {}).items())
        verdict = "dropped: " + "; ".join(v.get("problems") or []) if v.get("dropped") else \
            "passed" if v.get("passed") else "failed: " + "; ".join(v.get("problems") or [])
        rows.append([v.get("variant"), v.get("size_bytes"), diff, delta, v.get("latency_ms"), verdict])
    return rows


HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Model card: {{ title }}</title>
<style>
body { font-family: sans-serif; max-width: 1100px; margin: 1.5em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .hash { font-family: monospace; font-size: 0.85em; word-break: break-all; }
.verdict { display: inline-block; padding: 0.2em 0.6em; border-radius: 4px; font-weight: bold; }
small.champion { color: #666; }
.wide { overflow-x: auto; } #slices-table { font-size: 0.8em; }
.blessed { background: #d8f5d8; } .refused { background: #f8d8d8; } .failed { color: #a00; }
</style>
</head>
<body>
<h1>Model card: {{ title }}</h1>
<p>Generated {{ generated_at }}. The same content: <a href="model_card.md">Markdown</a>,
<a href="model_card.json">JSON</a>.</p>

<h2 id="lineage">Lineage</h2>
<table id="lineage-table">
{% for what, value in lineage_rows(lineage) %}
<tr><th>{{ what }}</th><td><code>{{ value }}</code></td></tr>
{% endfor %}
</table>
<table id="data-files">
<tr><th>data file</th><th>sha256</th><th>bytes</th></tr>
{% for f in lineage.data.files %}
<tr><td><code>{{ f.path }}</code></td><td class="hash">{{ f.sha256 }}</td><td class="num">{{ f.bytes }}</td></tr>
{% endfor %}
</table>

<h2 id="blessing">Blessing</h2>
{% if blessing %}
<p><span class="verdict {{ 'blessed' if blessing.blessed else 'refused' }}">
{{ 'blessed' if blessing.blessed else 'NOT blessed' }}</span></p>
<ul id="blessing-reasons">
{% for reason in blessing.reasons %}
<li{% if reason.startswith('FAILED') %} class="failed"{% endif %}>{{ reason }}</li>
{% endfor %}
</ul>
<table id="blessing-metrics">
<tr><th>metric</th><th>candidate</th><th>champion</th><th>trivial model</th></tr>
{% for row in blessing_rows(blessing) %}
<tr><td>{{ row[0] }}</td>{% for v in row[1:] %}<td class="num">{{ v | number }}</td>{% endfor %}</tr>
{% endfor %}
</table>
{% else %}
<p>No blessing recorded for this version.</p>
{% endif %}

<h2 id="slices">Slices</h2>
{% if slices %}
<p>Minimum slice size for gating: {{ slices.min_slice_size }}.</p>
<div class="wide">
<table id="slices-table">
<tr><th>slice</th><th>examples</th><th>gated</th>
{% for n in metric_names %}<th>{{ n }}</th>{% endfor %}</tr>
{% for s in slices.slices %}
<tr class="slice-row"><td>{{ s.slice }}</td><td class="num">{{ s.examples }}</td><td>{{ s.gated }}</td>
{% for n in metric_names %}<td class="num">{{ (s.candidate or {}).get(n) | number }}
{% if s.champion and s.champion.get(n) is not none %}<br><small class="champion">champion {{ s.champion.get(n) | number }}</small>{% endif %}</td>
{% endfor %}</tr>
{% endfor %}
</table>
</div>
{% for s in slices.slices if s.slice == 'Overall' %}
{% for head, c in (s.confusion or {}).items() %}
<table class="confusion">
<tr><th>{{ head }}: true \ predicted</th>{% for name in c.classes %}<th>{{ name }}</th>{% endfor %}</tr>
{% for row in c.matrix %}
<tr><th>{{ c.classes[loop.index0] }}</th>{% for n in row %}<td class="num">{{ n }}</td>{% endfor %}</tr>
{% endfor %}
</table>
{% endfor %}
{% endfor %}
{% if slices.gates %}
<table id="slice-gates">
<tr><th>slice</th><th>metric</th><th>candidate</th><th>champion</th><th>bound</th><th>result</th></tr>
{% for g in slices.gates %}
<tr><td>{{ g.slice }}</td><td>{{ g.metric }}</td><td class="num">{{ g.candidate | number }}</td>
<td class="num">{{ g.champion | number }}</td><td>{{ g.bound }}</td>
<td{% if not g.passed %} class="failed"{% endif %}>{{ g.text }}</td></tr>
{% endfor %}
</table>
{% endif %}
{% else %}
<p id="no-slices">No slices were computed for this version (its blessing has no slices.json).</p>
{% endif %}

<h2 id="training-curves">Training curves</h2>
{% if images.curves %}<img src="{{ images.curves }}" alt="training curves">
{% else %}<p>No training curves (no MLflow metric history, no TensorBoard files).</p>{% endif %}

<h2 id="calibration">Calibration</h2>
{% if images.calibration %}<img src="{{ images.calibration }}" alt="calibration plot">
{% else %}<p>No calibration computed for this version.</p>{% endif %}

<h2 id="tflite">TFLite variants and parity</h2>
{% if export %}
<p>SavedModel: {{ export.saved_model.get('size_bytes') | number }} bytes,
{{ export.saved_model.get('latency_ms') | number }} ms per example.</p>
<table id="tflite-table">
<tr><th>variant</th><th>bytes</th><th>max abs diff</th><th>metric delta</th><th>latency ms</th><th>parity</th></tr>
{% for row in tflite_rows(export) %}
<tr><td>{{ row[0] }}</td><td class="num">{{ row[1] }}</td><td>{{ row[2] }}</td><td>{{ row[3] }}</td>
<td class="num">{{ row[4] | number }}</td><td>{{ row[5] }}</td></tr>
{% endfor %}
</table>
{% else %}
<p>No export report.</p>
{% endif %}

<h2 id="limits">Known limits</h2>
<ul>
{% for line in limits %}<li>{{ line }}</li>
{% endfor %}
</ul>

<h2 id="config">Configuration</h2>
<details><summary>{{ lineage.config | length }} keys, as the run resolved them</summary>
<table>
{% for key, value in lineage.config.items() %}<tr><th>{{ key }}</th><td><code>{{ value }}</code></td></tr>
{% endfor %}
</table>
</details>
</body>
</html>
"""
