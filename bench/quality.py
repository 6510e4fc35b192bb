"""Model quality at the defaults: `loopline run` with the bundled configuration (only data.path,
data.eval_path and data.label set; the generic model, trainer.module_file null) against what a
five-line scikit-learn script gets on the same train/eval CSVs.

Tables (all offline): scikit-learn's bundled breast cancer, wine, diabetes (regression) and
digits (64 pixel columns); the bundled penguins as two tables (`species`; `body_mass_g` as
regression); and a generated survival table with a name-like text column of ~300 families and
missing values (written as empty fields). Each is split once, seeded (stratified for
classification, 70/30), and written as two CSVs that both sides read.

Baselines, scikit-learn at its defaults:
- `linear`: LogisticRegression (classification) or Ridge (regression) after SimpleImputer +
  StandardScaler on the numbers and OneHotEncoder(handle_unknown="ignore") on the text;
- `hist_gradient_boosting`: HistGradientBoosting{Classifier,Regressor}, NaN passed through, text
  as ordinal categories (OrdinalEncoder, unknown and missing as NaN, at most 255 categories: the
  model's limit).
loopline: the mean over QUALITY_SEEDS trainer seeds (default 5), each a fresh pipeline root.

Per table: loopline's accuracy or RMSE on the eval CSV (its Evaluator's figure), each baseline's,
the gap to the best baseline, the epoch and step each run exported, and the trivial floor (the
class priors of the train CSV, or its label mean, scored on the eval CSV). Target: no table
behind the best baseline by more than max(1 accuracy point, one eval example), or 5% RMSE.

`QUALITY_TABLES=wine,diabetes` and `QUALITY_SEEDS=2` pick fewer; `BENCH_LABEL` names the run.
`QUALITY_SPLIT_SEED=3` splits every table another way (recorded as `split_seed`; the docs' tables
are split 0's, and `across_splits` the means over splits 0-4): one split's eval rows are few (171
for breast cancer, one row 0.6 points), so a gap on one split is told from chance by repeating it
on others.
`QUALITY_TUNER=1` turns the Tuner step on (TUNER_OVERRIDES: loopline's search over the generic
model's keys, QUALITY_TUNER_TRIALS trials, default 8); each run then records the search's seconds.
`QUALITY_SET="trainer.ema_decay=0.99;trainer.hparams.l2=0.01"` adds config keys to every loopline
run (`;` between them): a variant of the defaults, recorded as `set` and kept out of the docs' table.
`markdown(runs)` writes the table docs/model-quality.md shows (tests compare the two).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import short_commit

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "quality.json"
SPLIT_SEED = 0  # the docs' split; QUALITY_SPLIT_SEED picks another
EVAL_FRACTION = 0.3
ACCURACY_SLACK = 0.01  # one accuracy point...
RMSE_SLACK = 0.05  # ...or 5% of the best baseline's RMSE
# The search QUALITY_TUNER=1 runs: the generic model's width, depth, penalty and dropout, the rate and batch.
SEARCH_SPACE = ("{learning_rate: {min: 0.001, max: 0.03, sampling: log}, batch_size: {values: [16, 32, 64]}, "
                "hparams.units: {values: [32, 64, 128]}, hparams.layers: {min: 1, max: 3}, "
                "hparams.l2: {min: 0.00001, max: 0.01, sampling: log}, hparams.dropout: {values: [0.0, 0.1, 0.3]}}")


def tuner_overrides() -> list[str]:
    """The Tuner's keys when QUALITY_TUNER is set, else none."""
    if os.environ.get("QUALITY_TUNER", "") in ("", "0"):
        return []
    return ["tuner.enabled=true", f"tuner.search_space={SEARCH_SPACE}",
            f"tuner.max_trials={int(os.environ.get('QUALITY_TUNER_TRIALS', '8'))}"]


def set_overrides() -> list[str]:
    """QUALITY_SET's config keys (a variant of the defaults), else none."""
    return [key.strip() for key in os.environ.get("QUALITY_SET", "").split(";") if key.strip()]


@dataclass
class Table:
    name: str
    label: str
    task: str  # "classification" or "regression"
    train: Path
    eval: Path
    overrides: list[str] = field(default_factory=list)  # what a user must set beyond the three data keys
    about: str = ""

    @property
    def metric(self) -> str:
        return "accuracy" if self.task == "classification" else "rmse"


# ---- the tables -------------------------------------------------------------------------------

def _sklearn_frame(loader, label: str, classes: bool, **kwargs):
    data = loader(as_frame=True, **kwargs)
    frame = data.frame.rename(columns={"target": label})
    if classes:
        frame[label] = [str(data.target_names[i]) for i in data.target]
    return frame


def _digits_frame():
    import pandas as pd
    from sklearn.datasets import load_digits

    data = load_digits()
    frame = pd.DataFrame(data.data.astype(int), columns=[f"pixel_{i // 8}_{i % 8}" for i in range(64)])
    frame["digit"] = data.target
    return frame


FAMILY_SYLLABLES = ["an", "ber", "cas", "dal", "el", "fen", "gor", "har", "is", "jor", "kel", "lan", "mor", "nel",
                    "or", "pal", "quin", "ros", "sten", "tor", "ul", "ver", "wes", "yor"]


def survival_frame(rows: int = 1000, families: int = 300, seed: int = 7):
    """A survival table: class, sex, age (20% missing), fare, port (some missing) and a family name
    shared by the members of ~300 families, whose latent fate (a random effect) moves every member's
    chance: the name carries signal only a model that learns per-name values can use."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    names = set()
    while len(names) < families:
        parts = rng.choice(FAMILY_SYLLABLES, size=rng.integers(2, 4))
        names.add("".join(parts).capitalize() + rng.choice(["", "son", "sen", "er", "ski"]))
    names = sorted(names)
    weights = rng.gamma(1.5, 1.0, families)
    family = rng.choice(families, size=rows, p=weights / weights.sum())
    effect = rng.normal(0.0, 1.3, families)[family]
    wealth = rng.normal(0.0, 1.0, families)[family] + rng.normal(0.0, 0.5, rows)
    pclass = np.where(wealth > 0.8, 1, np.where(wealth > -0.3, 2, 3))
    sex = rng.choice(["female", "male"], size=rows, p=[0.4, 0.6])
    age = np.clip(rng.normal(30, 14, rows), 0.5, 80).round(1)
    fare = np.round(np.exp(rng.normal(4.2 - 0.8 * pclass, 0.5)), 2)
    port = rng.choice(["S", "C", "Q"], size=rows, p=[0.7, 0.2, 0.1])
    score = (-0.6 + 2.4 * (sex == "female") + 0.9 * (pclass == 1) - 0.8 * (pclass == 3) + 1.2 * (age < 12)
             - 0.015 * (age - 30) + effect)
    survived = np.where(rng.random(rows) < 1 / (1 + np.exp(-score)), "yes", "no")
    frame = pd.DataFrame({"pclass": pclass, "sex": sex, "age": age, "fare": fare, "port": port,
                          "family": np.array(names)[family], "survived": survived})
    frame.loc[rng.random(rows) < 0.2, "age"] = np.nan
    frame.loc[rng.random(rows) < 0.02, "fare"] = np.nan
    frame.loc[rng.random(rows) < 0.02, "port"] = None
    return frame


def write_tables(folder: Path, only: list[str] | None = None, split_seed: int = SPLIT_SEED) -> list[Table]:
    """Every table split once (seeded) and written as train/eval CSVs; missing cells as empty fields."""
    import pandas as pd
    from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine
    from sklearn.model_selection import train_test_split

    penguins = pd.read_csv(REPO / "data" / "penguins.csv")
    specs = [
        ("breast_cancer", "diagnosis", "classification", lambda: _sklearn_frame(load_breast_cancer, "diagnosis", True),
         [], "scikit-learn's breast cancer: 569 rows, 30 numbers"),
        ("wine", "cultivar", "classification", lambda: _sklearn_frame(load_wine, "cultivar", True),
         [], "scikit-learn's wine: 178 rows, 13 numbers, 3 classes"),
        ("diabetes", "progression", "regression", lambda: _sklearn_frame(load_diabetes, "progression", False, scaled=False),
         [], "scikit-learn's diabetes (raw units): 442 rows, 10 numbers"),
        ("digits", "digit", "classification", _digits_frame, ["data.label_kind=classification", "validation.warn_only=true"],
         "scikit-learn's digits as 64 integer columns: 1,797 rows, 10 classes (the label is a number: "
         "data.label_kind=classification; the data gate stops on the train/eval drift of edge pixels that are "
         "almost always 0, e.g. pixel_7_0's Jensen-Shannon divergence 1.0: validation.warn_only=true)"),
        ("penguins_species", "species", "classification", lambda: penguins.copy(),
         [], "the bundled penguins: 344 rows, species from the other columns"),
        ("penguins_body_mass", "body_mass_g", "regression", lambda: penguins.dropna(subset=["body_mass_g"]),
         [], "the bundled penguins: 342 rows with a body mass, regressed on the other columns"),
        ("survival", "survived", "classification", survival_frame,
         [], "generated: 1,000 rows, class, sex, age (20% missing), fare, port, family name (~300 families)"),
    ]
    tables = []
    folder.mkdir(parents=True, exist_ok=True)
    for name, label, task, make, overrides, about in specs:
        if only and name not in only:
            continue
        frame = make().reset_index(drop=True)
        stratify = frame[label] if task == "classification" else None
        train, evaluation = train_test_split(frame, test_size=EVAL_FRACTION, random_state=split_seed, stratify=stratify)
        paths = folder / f"{name}_train.csv", folder / f"{name}_eval.csv"
        train.to_csv(paths[0], index=False)
        evaluation.to_csv(paths[1], index=False)
        tables.append(Table(name, label, task, *paths, overrides, about))
    unknown = sorted(set(only or []) - {t.name for t in tables})
    if unknown:
        raise ValueError(f"QUALITY_TABLES: unknown table(s) {unknown}; tables are {[s[0] for s in specs]}")
    return tables


# ---- scikit-learn and the trivial floor -------------------------------------------------------

def _frames(table: Table):
    import pandas as pd

    train, evaluation = pd.read_csv(table.train), pd.read_csv(table.eval)
    features = [c for c in train.columns if c != table.label]
    return train[features], train[table.label], evaluation[features], evaluation[table.label]


def _score(table: Table, truth, predicted) -> float:
    import numpy as np

    if table.task == "classification":
        return float(np.mean(np.asarray(truth) == np.asarray(predicted)))
    return float(np.sqrt(np.mean((np.asarray(truth, float) - np.asarray(predicted, float)) ** 2)))


def baselines(table: Table) -> dict[str, float]:
    """LogisticRegression / Ridge and HistGradientBoosting at their defaults, on the eval CSV."""
    import numpy as np
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    x_train, y_train, x_eval, y_eval = _frames(table)
    text = [c for c in x_train.columns if x_train[c].dtype == object]
    numbers = [c for c in x_train.columns if c not in text]
    classify = table.task == "classification"
    linear = make_pipeline(
        ColumnTransformer([("numbers", make_pipeline(SimpleImputer(), StandardScaler()), numbers),
                           ("text", OneHotEncoder(handle_unknown="ignore"), text)]),
        LogisticRegression() if classify else Ridge())
    ordinal = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan, encoded_missing_value=np.nan,
                             max_categories=255)
    boosted_model = (HistGradientBoostingClassifier if classify else HistGradientBoostingRegressor)(
        categorical_features=[False] * len(numbers) + [True] * len(text))
    boosted = make_pipeline(ColumnTransformer([("numbers", "passthrough", numbers), ("text", ordinal, text)]),
                            boosted_model)
    scores = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LogisticRegression's default max_iter does not converge on digits
        for name, model in (("linear", linear), ("hist_gradient_boosting", boosted)):
            model.fit(x_train, y_train)
            scores[name] = round(_score(table, y_eval, model.predict(x_eval)), 4)
    return scores


def trivial_floor(table: Table) -> dict[str, float]:
    """The model that ignores the features, fitted on the train CSV and scored on the eval CSV:
    class priors (log loss, and the majority class's accuracy) or the label mean (RMSE)."""
    import numpy as np

    _, y_train, _, y_eval = _frames(table)
    if table.task == "classification":
        priors = y_train.astype(str).value_counts(normalize=True)
        truth = y_eval.astype(str)
        seen = truth.isin(priors.index)
        return {"log_loss": round(float(-np.log(priors[truth[seen]].to_numpy()).mean()), 4),
                "majority_accuracy": round(float((truth == priors.idxmax()).mean()), 4)}
    mean = float(y_train.mean())
    return {"rmse": round(_score(table, y_eval, np.full(len(y_eval), mean)), 4)}


# ---- loopline ---------------------------------------------------------------------------------

def loopline_run(table: Table, seed: int, root: Path) -> dict:
    """One `loopline run` with the bundled configuration and the table's data keys (MLflow off:
    it does not change the model). A run that fails is recorded with its error, not averaged."""
    try:
        return _loopline_run(table, seed, root)
    except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others' figures
        lines = str(exc).strip().splitlines()
        return {"seed": seed, "error": f"{type(exc).__name__}: {' / '.join(lines[-3:])[:600]}"}


def _loopline_run(table: Table, seed: int, root: Path) -> dict:
    import keras

    from pipeline.config import load_config
    from pipeline.local_runner import run_local
    from serving.signature_names import signature_name

    overrides = [f"pipeline.root={root}", f"data.path={table.train}", f"data.eval_path={table.eval}",
                 f"data.label={table.label}", "trainer.module_file=null", f"trainer.seed={seed}",
                 "mlflow.enabled=false", *table.overrides, *tuner_overrides(), *set_overrides()]
    config = load_config(REPO / "loopline.yaml", overrides)
    started = time.perf_counter()
    summary = run_local(config)
    seconds = time.perf_counter() - started
    keras.utils.clear_session()
    head = signature_name(table.label)
    metrics = summary.metrics
    exported = getattr(summary, "exported", None) or {}
    train_rows = sum(1 for _ in open(table.train)) - 1
    steps = int(metrics.get("steps", 0))
    return {
        "seed": seed,
        table.metric: round(metrics[f"{head}_{table.metric}"], 4),
        "loss": round(metrics[f"{head}_loss"], 4),
        "exported_step": int(exported.get("step", steps)),
        # Before the best epoch was exported: the last one (steps / steps per epoch of the whole train CSV).
        "exported_epoch": int(exported["epoch"]) if "epoch" in exported else math.ceil(steps / max(train_rows // config.trainer.batch_size, 1)),
        "blessed": summary.blessed,
        "blessing_reasons": summary.blessing_reasons,
        "seconds": round(seconds, 1),
        **({"tuner_seconds": round(summary.seconds.get("Tuner", 0.0), 1)} if config.tuner.on else {}),
    }


def _best_baseline(scores: dict[str, float], task: str) -> str:
    """The baseline with the highest accuracy (classification) or the lowest RMSE."""
    higher = task == "classification"
    return max(scores, key=lambda k: scores[k] if higher else -scores[k])


def _gap(task: str, loopline: float, best: float, eval_rows: int) -> dict:
    """How far loopline is behind the best baseline (negative: ahead), and the allowed gap."""
    if task == "classification":
        behind, allowed = best - loopline, max(ACCURACY_SLACK, 1.0 / eval_rows)
        relative = (loopline - best) / best
    else:
        behind, allowed = loopline / best - 1.0, RMSE_SLACK
        relative = (best - loopline) / best
    return {"behind": round(behind, 4), "allowed": round(allowed, 4), "met": bool(behind <= allowed + 1e-9),
            "relative_advantage": round(relative, 4)}


def measure_table(table: Table, seeds: list[int], work: Path) -> dict:
    import numpy as np

    eval_rows = sum(1 for _ in open(table.eval)) - 1
    scores = baselines(table)
    runs = [loopline_run(table, seed, work / f"{table.name}_{seed}") for seed in seeds]
    scored = [r[table.metric] for r in runs if table.metric in r]
    if not scored:
        print(f"quality {table.name}: every loopline run failed: {runs[0]['error']}", flush=True)
        return {"about": table.about, "task": table.task, "metric": table.metric, "label": table.label,
                "overrides": table.overrides, "loopline_runs": runs, "baselines": scores, "trivial": trivial_floor(table)}
    mean = round(float(np.mean(scored)), 4)
    best = _best_baseline(scores, table.task)
    result = {
        "about": table.about, "task": table.task, "metric": table.metric, "label": table.label,
        "overrides": table.overrides, "eval_rows": eval_rows, "train_rows": sum(1 for _ in open(table.train)) - 1,
        "csv_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in (table.train, table.eval)},
        "loopline": mean, "loopline_std": round(float(np.std(scored)), 4),
        "loopline_runs": runs, "baselines": scores, "best_baseline": best,
        "gap": _gap(table.task, mean, scores[best], eval_rows), "trivial": trivial_floor(table),
    }
    print(f"quality {table.name}: loopline {table.metric} {mean} (seeds {scored}, "
          f"epochs {[r.get('exported_epoch') for r in runs]}); baselines {scores}; gap {result['gap']}", flush=True)
    return result


def run() -> dict:
    only = [t for t in os.environ.get("QUALITY_TABLES", "").split(",") if t]
    seeds = list(range(int(os.environ.get("QUALITY_SEEDS", "5"))))
    split_seed = int(os.environ.get("QUALITY_SPLIT_SEED", str(SPLIT_SEED)))
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        tables = write_tables(work / "data", only or None, split_seed)
        results = {t.name: measure_table(t, seeds, work) for t in tables}
    met = [name for name, r in results.items() if r.get("gap", {}).get("met")]
    gaps = [r["gap"]["relative_advantage"] for r in results.values() if "gap" in r]
    return {"seeds": seeds, "split_seed": split_seed, "tables": results, "tuner": tuner_overrides(), "set": set_overrides(),
            "tables_within_target": len(met), "tables_measured": len(results),
            "tables_failed": sorted(name for name, r in results.items() if "gap" not in r),
            "mean_relative_advantage_over_best_baseline": round(sum(gaps) / len(gaps), 4) if gaps else None}


# ---- the docs table ---------------------------------------------------------------------------

def _cell(metric: str, value: float) -> str:
    return f"{value:.3f}" if metric == "accuracy" else f"{value:.1f}"


def _behind(entry: dict) -> str:
    gap = entry["gap"]
    if entry["metric"] == "accuracy":
        text = f"{gap['behind'] * 100:+.1f} pt"
    else:
        text = f"{gap['behind'] * 100:+.1f}%"
    return text + ("" if gap["met"] else " **(missed)**")


def markdown_table(result: dict) -> str:
    """One run's table: per table loopline (mean over seeds), each baseline, the gap to the best
    baseline (positive: loopline behind), the epochs exported and the trivial floor."""
    lines = ["| table | metric | loopline (mean of seeds) | LogisticRegression / Ridge | HistGradientBoosting | "
             "behind the best | epochs exported | trivial floor |",
             "|---|---|---|---|---|---|---|---|"]
    for name, entry in result["tables"].items():
        metric, scores = entry["metric"], entry["baselines"]
        epochs = ", ".join(str(r.get("exported_epoch", "failed")) for r in entry["loopline_runs"])
        trivial = entry["trivial"]
        floor = (f"log loss {trivial['log_loss']:.3f}, majority accuracy {trivial['majority_accuracy']:.3f}"
                 if metric == "accuracy" else f"RMSE {trivial['rmse']:.1f}")
        ours, behind = ((_cell(metric, entry["loopline"]), _behind(entry)) if "gap" in entry
                        else ("every run failed", "**(missed)**"))
        lines.append(f"| {name} | {metric} | {ours} | {_cell(metric, scores['linear'])} | "
                     f"{_cell(metric, scores['hist_gradient_boosting'])} | {behind} | {epochs} | {floor} |")
    lines.append("")
    advantage = result["mean_relative_advantage_over_best_baseline"]
    lines.append(f"{result['tables_within_target']} of {result['tables_measured']} tables within the target; "
                 + (f"mean relative advantage over the best baseline {advantage * 100:+.1f}% " if advantage is not None else "")
                 + f"(commit {short_commit(result.get('commit'))}, seeds {result['seeds']}).")
    return "\n".join(lines) + "\n"


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4)


SPLITS = range(5)  # the splits the summary across splits needs, each with a full run at the defaults


def _on_every_table(run: dict, tuner: bool) -> bool:
    """A run on all seven tables without QUALITY_SET keys: at the defaults with at least 3 seeds,
    or (`tuner`) with the Tuner on and at least 2 (each of its runs is a search)."""
    return (run.get("tables_measured", 0) >= 7 and len(run.get("seeds", [])) >= (2 if tuner else 3)
            and bool(run.get("tuner")) == tuner and not run.get("set") and not run.get("tables_failed"))


def across_splits(runs: list[dict], tuner: bool = False) -> dict | None:
    """Per table, loopline's and each baseline's mean over SPLITS (each split's latest run at the
    defaults on every table, or with the Tuner on: `tuner`), the gap between those means and the
    target on it; None until every split has such a run. One split's eval rows are few (171 for
    breast cancer, a row is 0.6 points), so the mean over five draws of eval rows tells a model's
    gap from the draw's."""
    latest = {}
    for run in runs:
        if _on_every_table(run, tuner):
            latest[run.get("split_seed", SPLIT_SEED)] = run
    if any(split not in latest for split in SPLITS):
        return None
    picked = [latest[split] for split in SPLITS]
    tables = {}
    for name, first in picked[0]["tables"].items():
        entries = [run["tables"][name] for run in picked]
        loopline = _mean([e["loopline"] for e in entries])
        scores = {b: _mean([e["baselines"][b] for e in entries]) for b in first["baselines"]}
        best = _best_baseline(scores, first["task"])
        eval_rows = min(e["eval_rows"] for e in entries)
        tables[name] = {"metric": first["metric"], "per_split": [e["loopline"] for e in entries], "loopline": loopline,
                        "baselines": scores, "best_baseline": best,
                        "gap": _gap(first["task"], loopline, scores[best], eval_rows)}
    gaps = [t["gap"]["relative_advantage"] for t in tables.values()]
    return {"tables": tables, "runs": [{"split_seed": split, "commit": short_commit(run.get("commit")),
                                        "seeds": len(run["seeds"]), "date": run.get("date")}
                                       for split, run in zip(SPLITS, picked)],
            "tables_within_target": sum(t["gap"]["met"] for t in tables.values()), "tables_measured": len(tables),
            "mean_relative_advantage_over_best_baseline": round(sum(gaps) / len(gaps), 4)}


def markdown_across_splits(summary: dict) -> str:
    """`across_splits` as a table: loopline per split (mean of its seeds), the means over splits."""
    lines = ["| table | metric | loopline per split (0-4) | loopline, mean | LogisticRegression / Ridge, mean | "
             "HistGradientBoosting, mean | behind the best |",
             "|---|---|---|---|---|---|---|"]
    for name, entry in summary["tables"].items():
        metric, scores = entry["metric"], entry["baselines"]
        per_split = ", ".join(_cell(metric, value) for value in entry["per_split"])
        lines.append(f"| {name} | {metric} | {per_split} | {_cell(metric, entry['loopline'])} | "
                     f"{_cell(metric, scores['linear'])} | {_cell(metric, scores['hist_gradient_boosting'])} | "
                     f"{_behind(entry)} |")
    runs = "; ".join(f"split {r['split_seed']}: commit {r['commit']}, {r['seeds']} seeds" for r in summary["runs"])
    advantage = summary["mean_relative_advantage_over_best_baseline"]
    lines += ["", f"{summary['tables_within_target']} of {summary['tables_measured']} tables within the target on the "
              f"means over the splits; mean relative advantage over the best baseline {advantage * 100:+.1f}% ({runs})."]
    return "\n".join(lines) + "\n"


def markdown(runs: list[dict]) -> str:
    """The docs' tables: the latest full run (every table, the default 5 seeds, the Tuner off), the
    full run before it and, when kept, the first full run labelled "before"; then, once every split
    has a run at the defaults (and with the Tuner on), the means over the splits (`across_splits`).
    Other runs of fewer seeds, with the Tuner on, on another split or with QUALITY_SET keys are kept
    in the results only."""
    full = [r for r in runs if r.get("tables_measured", 0) >= 7 and len(r.get("seeds", [])) >= 5 and not r.get("tuner")
            and not r.get("set") and r.get("split_seed", SPLIT_SEED) == SPLIT_SEED]
    out = []
    before = [r for r in full if r.get("label", "").startswith("before")]
    shown = full[-2:][::-1] + [run for run in before[:1] if run not in full[-2:]]
    for run in shown:
        out += [f"### {run.get('label') or 'Latest run'} ({run['date']} UTC)", "", markdown_table(run)]
    for tuner, title in ((False, "at the defaults"), (True, "with the Tuner on")):
        summary = across_splits(runs, tuner)
        if summary:
            out += [f"### Across five splits: the means over splits 0-4 of each split's latest run {title}", "",
                    markdown_across_splits(summary)]
    return "\n".join(out)


def read_runs(path: Path = RESULTS) -> list[dict]:
    return json.loads(path.read_text())["runs"] if path.exists() else []


DOCS = REPO / "docs" / "model-quality.md"
DOCS_START, DOCS_END = "<!-- quality-table:start -->", "<!-- quality-table:end -->"


def write_docs(page: Path = DOCS, runs: list[dict] | None = None) -> None:
    """Replaces the page's generated section with `markdown` of the kept runs."""
    text = page.read_text()
    head, rest = text.split(DOCS_START, 1)
    tail = rest.split(DOCS_END, 1)[1]
    page.write_text(f"{head}{DOCS_START}\n{markdown(read_runs() if runs is None else runs).strip()}\n{DOCS_END}{tail}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--docs"]:
        sys.exit("usage: python -m bench.quality --docs   (the bench itself: make bench BENCH=quality)")
    write_docs()
    print(f"wrote the table of {RESULTS} into {DOCS}")
