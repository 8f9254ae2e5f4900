"""A markdown report with plots of a sweep's runs: per-arm means with 95 % intervals, paired differences.

    python -m experiments.report runs/seed_claims                          # -> runs/seed_claims/report/
    python -m experiments.report runs/seed_claims --baseline=grpo --out=docs/study
    python -m experiments.report runs/seed_claims --threshold=0.40         # + completions to pass@1 >= 0.40
    python -m experiments.report runs/ablate                               # launch/ablate.sh's <arm>_s<seed>

Runs: the arms and seeds of RUNS_DIR/manifest.json (experiments.sweep) with workdirs RUNS_DIR/<arm>/s<seed>;
without a manifest, every RUNS_DIR/<arm>/s<seed>/ or RUNS_DIR/<arm>_s<seed>/ holding results.json (names
starting with "_", the sweep's warm starts, are not arms). A run counts when its results.json has the final
evaluation ("grpo"); the others are listed as missing and left out of every number.

Numbers, per arm over its seeds (grpo_jax.stats): the mean with a 95 % percentile-bootstrap interval
(`--resamples`, RNG seed 0), and the paired difference arm − baseline over the seeds both arms finished
(bootstrap over the pairs), with the count of seeds where Δ > 0. Metrics: held-out greedy pass@1
and sampled pass@k after GRPO (results.json "grpo"), held-out pass@1 after SFT ("sft": with a shared warm
start it is the same in every arm), the training reward averaged over the last `--last_steps` steps
(metrics.jsonl "reward") and the policy entropy over the same steps, the median GRPO step time and the memory
peaks by the last GRPO step (results.json "memory_grpo_this_process": host RSS, and the device allocator's
peak on accelerators; older runs have none). `--threshold=T`: completions sampled until the held-out
`--threshold_metric` first reached T (the evaluated steps of metrics.jsonl × prompts_per_step × group_size:
the nominal count; dynamic-sampling refills and pool members sample more), the rate of seeds that reached it
with a Wilson interval. `--collapse_entropy=H`: a run collapsed when its mean policy entropy over the last
`--last_steps` steps is below H and its final held-out pass@k (`--collapse_k`, default the largest k
evaluated) is below its post-SFT value; the rate over seeds with a Wilson interval.

Before and after GRPO (paired by seed): every key of results.json "sft" and "grpo" both (held-out pass@k,
mbpp/ and humaneval/ pass@1), plus experiments.evaluate outputs of a run's final checkpoint placed in
WORKDIR/evals/NAME (greedy pass@1 as NAME/pass@1; `--evals_before=DIR`: DIR/NAME of the initial policy is
its "before"), each with the change after − before and its bootstrap interval over seeds.

Plots (matplotlib, Agg, PNG next to report.md): learning curves of the training reward and of the held-out
metric per step (mean over seeds, 95 % bootstrap band), and bar charts of the final metrics and of the
paired differences with their intervals as error bars. The same runs give the same files, byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
import sys

import numpy as np
from absl import app, flags

from grpo_jax import stats

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line; defined when run as a program only, so that importing this module (the tests)
    defines no absl flag that could collide with another experiment's in the same process."""
    flags.DEFINE_string(
        "baseline", None, "The arm the others are compared with (default: 'baseline' or the first)."
    )
    flags.DEFINE_string("out", None, "Output directory of report.md and the PNGs (default RUNS_DIR/report).")
    flags.DEFINE_integer(
        "resamples", stats.DEFAULT_RESAMPLES, "Bootstrap resamples per interval.", lower_bound=1
    )
    flags.DEFINE_integer("last_steps", 10, "Steps at the end averaged for the training reward / entropy.")
    flags.DEFINE_float("threshold", None, "Held-out threshold for the completions-to-threshold table (off).")
    flags.DEFINE_string("threshold_metric", "eval/pass_at_1", "metrics.jsonl key the threshold applies to.")
    flags.DEFINE_float("collapse_entropy", None, "Entropy floor of the collapse definition (off when unset).")
    flags.DEFINE_integer("collapse_k", None, "pass@k of the collapse definition (default: the largest k).")
    flags.DEFINE_string(
        "evals_before",
        None,
        "A directory of experiments.evaluate outputs of the policy every run starts from "
        "(NAME/results.json): their greedy pass@1 is the 'before' of each run's WORKDIR/evals/NAME.",
    )


RUN_DIR = re.compile(r"(?P<arm>[A-Za-z0-9][A-Za-z0-9_.-]*?)_s(?P<seed>\d+)")


@dataclasses.dataclass
class Run:
    arm: str
    seed: int
    workdir: str
    results: dict
    metrics: list[dict]  # metrics.jsonl, one dict per line (the last line of a step wins per key)


@dataclasses.dataclass
class Study:
    runs_dir: str
    arms: list[str]
    seeds: list[int]
    runs: dict[str, dict[int, Run]]  # arm -> seed -> finished run
    missing: list[tuple[str, int, str]]  # (arm, seed, why)
    source: str  # how the runs were found
    commands: dict[str, list[str]]  # arm -> the command of its first seed (from the manifest)


# ------------------------------------------------------------------------------------------------------------
# reading the runs
# ------------------------------------------------------------------------------------------------------------


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_metrics(path: str) -> list[dict]:
    """metrics.jsonl as dicts with float values ("nan" / "inf" strings read back); cut lines skipped."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash
                if isinstance(row, dict) and isinstance(row.get("step"), int):
                    out.append({k: (v if k == "step" else _float(v)) for k, v in row.items()})
    except OSError:
        pass
    return out


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _layout(runs_dir: str) -> list[tuple[str, int, str]]:
    """(arm, seed, workdir) of <arm>/s<seed>/ and <arm>_s<seed>/ directories holding results.json."""
    found = []
    for name in sorted(os.listdir(runs_dir)):
        d = os.path.join(runs_dir, name)
        if name.startswith("_") or not os.path.isdir(d):
            continue
        m = RUN_DIR.fullmatch(name)
        if m and os.path.isfile(os.path.join(d, "results.json")):
            found.append((m["arm"], int(m["seed"]), d))
            continue
        for sub in sorted(os.listdir(d)):
            if re.fullmatch(r"s\d+", sub) and os.path.isfile(os.path.join(d, sub, "results.json")):
                found.append((name, int(sub[1:]), os.path.join(d, sub)))
    return found


def load_study(runs_dir: str) -> Study:
    manifest = _read_json(os.path.join(runs_dir, "manifest.json"))
    commands: dict[str, list[str]] = {}
    if isinstance(manifest, dict) and manifest.get("arms"):
        arms, seeds = list(manifest["arms"]), sorted(manifest["seeds"])
        points = [(a, s, os.path.join(runs_dir, a, f"s{s}")) for a in arms for s in seeds]
        for p in manifest.get("points", []):
            if p.get("kind") == "run" and p.get("arm") not in commands:
                commands[p["arm"]] = p["command"]
        source = f"manifest.json (grid {manifest.get('grid', '?')})"
    else:
        points = _layout(runs_dir)
        arms = list(dict.fromkeys(a for a, _, _ in points))
        points.sort(key=lambda p: (arms.index(p[0]), p[1]))
        seeds = sorted({s for _, s, _ in points})
        source = "the directory layout (no manifest.json)"
    runs: dict[str, dict[int, Run]] = {a: {} for a in arms}
    missing = []
    for arm, seed, wd in points:
        res = _read_json(os.path.join(wd, "results.json"))
        if not isinstance(res, dict):
            missing.append((arm, seed, "no results.json (not run or not finished)"))
        elif "grpo" not in res:
            missing.append((arm, seed, "results.json without the final evaluation"))
        else:
            runs[arm][seed] = Run(arm, seed, wd, res, read_metrics(os.path.join(wd, "metrics.jsonl")))
    if not manifest:
        have = {(a, s) for a, s, _ in points}
        missing += [
            (a, s, "no run directory with results.json") for a in arms for s in seeds if (a, s) not in have
        ]
    return Study(runs_dir, arms, seeds, runs, sorted(missing), source, commands)


def _greedy_pass1(path: str, step: int | None = None) -> float | None:
    """experiments.evaluate's greedy pass@1 in path/results.json (None if absent, or of another step)."""
    res = _read_json(os.path.join(path, "results.json"))
    if not isinstance(res, dict) or "greedy/pass@1" not in res.get("metrics", {}):
        return None
    if step is not None and res.get("policy", {}).get("step") != step:
        return None
    return float(res["metrics"]["greedy/pass@1"])


def add_evals(study: Study, before_dir: str | None) -> list[str]:
    """Fold experiments.evaluate outputs into the runs' results (in memory): WORKDIR/evals/NAME of a run's
    final checkpoint becomes results["grpo"]["NAME/pass@1"] (greedy), and before_dir/NAME (the common initial
    policy) results["sft"]["NAME/pass@1"]; a run's own evaluation of that name (--eval_mbpp, --eval_humaneval)
    is kept. Returns the names folded in."""
    names: set[str] = set()
    for arm in study.runs.values():
        for r in arm.values():
            d = os.path.join(r.workdir, "evals")
            for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                after = _greedy_pass1(os.path.join(d, name), r.results.get("grpo_eval_step"))
                key = f"{name}/pass@1"
                if after is None or key in r.results["grpo"]:
                    continue
                names.add(name)
                r.results["grpo"][key] = after
                before = _greedy_pass1(os.path.join(before_dir, name)) if before_dir else None
                if before is not None:
                    r.results.setdefault("sft", {})[key] = before
    return sorted(names)


def curve(run: Run, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metrics.jsonl key, one value per step (the last line that has it)."""
    by_step: dict[int, float] = {}
    for row in run.metrics:
        if key in row:
            by_step[row["step"]] = row[key]
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


# ------------------------------------------------------------------------------------------------------------
# per-run numbers
# ------------------------------------------------------------------------------------------------------------


def pass_ks(study: Study) -> list[int]:
    ks = set()
    for arm in study.runs.values():
        for r in arm.values():
            ks |= {int(k[5:]) for k in r.results["grpo"] if re.fullmatch(r"pass@\d+", k)}
    return sorted(ks)


def last_mean(run: Run, key: str, n: int) -> float:
    _, v = curve(run, key)
    v = [x for x in v if not math.isnan(x)][-n:]
    return float(np.mean(v)) if v else math.nan


def metric_values(study: Study, fn) -> dict[str, dict[int, float]]:
    """{arm: {seed: fn(run)}} without the runs where fn gives None or NaN."""
    out: dict[str, dict[int, float]] = {}
    for arm in study.arms:
        vals = {}
        for s, r in study.runs[arm].items():
            v = fn(r)
            if v is not None and not math.isnan(v):
                vals[s] = float(v)
        out[arm] = vals
    return out


def completions(run: Run, threshold: float, key: str) -> float:
    ro = run.results.get("config", {}).get("rollout", {})
    per_step = ro.get("prompts_per_step", math.nan) * ro.get("group_size", math.nan)
    steps, values = curve(run, key)
    return stats.completions_to_threshold(steps, values, threshold, per_step)


def collapsed(run: Run, floor: float, k: int, last: int) -> bool | None:
    ent = last_mean(run, "entropy", last)
    before, after = run.results.get("sft", {}).get(f"pass@{k}"), run.results["grpo"].get(f"pass@{k}")
    if math.isnan(ent) or before is None or after is None:
        return None
    return ent < floor and after < before


# ------------------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------------------


def _ci(e: stats.Estimate, fmt: str) -> str:
    if e.n == 0:
        return "-"
    return f"[{e.low:{fmt}}, {e.high:{fmt}}]"


def metric_table(values: dict[str, dict[int, float]], baseline: str, resamples: int, fmt: str = ".3f") -> str:
    head = ["arm", "n", "mean", "95 % CI", f"Δ vs {baseline}", "95 % CI of Δ", "seeds Δ > 0"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = values.get(baseline, {})
    for arm, vals in values.items():
        e = stats.bootstrap_ci(list(vals[s] for s in sorted(vals)), resamples=resamples)
        cells = [arm, str(e.n), f"{e.value:{fmt}}" if e.n else "-", _ci(e, fmt)]
        seeds, d = stats.paired_differences(vals, base)
        if arm == baseline or not seeds:
            cells += ["", "", ""]
        else:
            de = stats.paired_bootstrap_ci(vals, base, resamples=resamples)
            better = int(np.sum(d > 0))
            cells += [f"{de.value:+{fmt}}", _ci(de, "+" + fmt), f"{better}/{len(seeds)}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_seed_table(values: dict[str, dict[int, float]], seeds: list[int], fmt: str = ".3f") -> str:
    head = ["arm"] + [f"s{s}" for s in seeds]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, vals in values.items():
        lines.append(
            "| " + " | ".join([arm] + [f"{vals[s]:{fmt}}" if s in vals else "-" for s in seeds]) + " |"
        )
    return "\n".join(lines)


def turn_metric_rows(study: Study, last_steps: int) -> list:
    """Multi-turn studies (runs evaluated with --eval_max_turns / --max_turns > 1): held-out greedy pass@1
    after each later turn, the greedy fix rate, and the model tokens sampled per step (the compute match)."""
    turns = {
        int(m.group(1))
        for arm in study.runs.values()
        for r in arm.values()
        for k in r.results["grpo"]
        if (m := re.fullmatch(r"turn(\d+)/pass@1", k))
    }
    rows = [
        (
            f"held-out pass@1 (greedy) after turn {t} (execution feedback), after GRPO",
            f"turn{t}_pass_at_1",
            lambda r, t=t: r.results["grpo"].get(f"turn{t}/pass@1"),
        )
        for t in sorted(turns)
        if t > 1
    ]
    if rows:
        rows += [
            (
                "held-out fix rate (greedy: of the problems failed at turn 1, the share a later turn passed)",
                None,
                lambda r: r.results["grpo"].get("fix_rate"),
            ),
            (
                f"model tokens sampled per step, mean of the last {last_steps} steps",
                None,
                lambda r: last_mean(r, "rollout/sampled_tokens", last_steps),
            ),
        ]
    return rows


def before_after_keys(study: Study) -> list[str]:
    """The evaluation keys measured both at the start of GRPO ("sft") and after it ("grpo") in some run:
    held-out pass@k and the extra sets' pass@1 (mbpp/, humaneval/), in a fixed order."""
    keys = set()
    for arm in study.runs.values():
        for r in arm.values():
            sft = r.results.get("sft", {})
            keys |= {k for k in r.results["grpo"] if k in sft and re.fullmatch(r"pass@\d+|\w+/pass@1", k)}
    return sorted(keys, key=lambda k: ("/" in k, k.split("@")[0], int(k.split("@")[1])))


def before_after_table(study: Study, keys: list[str], resamples: int, fmt: str = ".3f") -> str:
    """Per arm and metric: the value at the start of GRPO and after it (mean over seeds, bootstrap interval)
    and the change after − before paired by seed, with the count of seeds where it rose."""
    head = ["arm", "metric", "n", "before", "95 % CI", "after", "95 % CI", "Δ after − before", "95 % CI of Δ"]
    head.append("seeds Δ > 0")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in study.arms:
        for key in keys:
            pairs = {
                s: (r.results["sft"][key], r.results["grpo"][key])
                for s, r in study.runs[arm].items()
                if key in r.results.get("sft", {}) and key in r.results["grpo"]
            }
            if not pairs:
                continue
            before = {s: float(b) for s, (b, _) in pairs.items()}
            after = {s: float(a) for s, (_, a) in pairs.items()}
            eb = stats.bootstrap_ci([before[s] for s in sorted(before)], resamples=resamples)
            ea = stats.bootstrap_ci([after[s] for s in sorted(after)], resamples=resamples)
            de = stats.paired_bootstrap_ci(after, before, resamples=resamples)
            rose = sum(after[s] > before[s] for s in pairs)
            cells = [arm, key, str(len(pairs)), f"{eb.value:{fmt}}", _ci(eb, fmt), f"{ea.value:{fmt}}"]
            cells += [_ci(ea, fmt), f"{de.value:+{fmt}}", _ci(de, "+" + fmt), f"{rose}/{len(pairs)}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _count(x: float) -> str:
    return "not reached" if math.isinf(x) else f"{x:,.0f}".replace(",", " ")


def threshold_table(study: Study, threshold: float, key: str) -> str:
    head = ["arm", "n", "reached", "rate 95 % CI (Wilson)", "median completions", "per seed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in study.arms:
        runs = study.runs[arm]
        c = {s: completions(r, threshold, key) for s, r in sorted(runs.items())}
        c = {s: v for s, v in c.items() if not math.isnan(v)}
        k = sum(not math.isinf(v) for v in c.values())
        w = stats.wilson_interval(k, len(c))
        med = statistics.median(c.values()) if c else math.nan
        cells = [arm, str(len(c)), f"{k}/{len(c)}", _ci(w, ".2f"), _count(med) if c else "-"]
        cells.append(", ".join(f"s{s} {_count(v)}" for s, v in c.items()))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def collapse_table(study: Study, floor: float, k: int, last: int) -> str:
    head = ["arm", "n", "collapsed", "rate", "95 % CI (Wilson)", "seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in study.arms:
        flags_ = {s: collapsed(r, floor, k, last) for s, r in sorted(study.runs[arm].items())}
        flags_ = {s: f for s, f in flags_.items() if f is not None}
        n, m = len(flags_), sum(flags_.values())
        w = stats.wilson_interval(m, n)
        rate = f"{w.value:.2f}" if n else "-"
        names = ", ".join(f"s{s}" for s, f in flags_.items() if f) or "none"
        lines.append("| " + " | ".join([arm, str(n), f"{m}/{n}", rate, _ci(w, ".2f"), names]) + " |")
    return "\n".join(lines)


def config_differences(study: Study, baseline: str) -> dict[str, list[str]]:
    """arm -> the config fields (from results.json) where its first seed differs from the baseline's."""
    ignore = ("workdir", "seed", "sft.from_workdir")

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
        return out

    base_runs = study.runs.get(baseline, {})
    if not base_runs:
        return {}
    base = flat(base_runs[min(base_runs)].results.get("config", {}))
    out = {}
    for arm in study.arms:
        if arm == baseline or not study.runs[arm]:
            continue
        mine = flat(study.runs[arm][min(study.runs[arm])].results.get("config", {}))
        keys = sorted(k for k in set(mine) | set(base) if k not in ignore and mine.get(k) != base.get(k))
        out[arm] = [f"{k}={json.dumps(mine.get(k))}" for k in keys]
    return out


# ------------------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9})
    return plt


def _save(fig, path: str) -> None:
    fig.savefig(path, format="png", metadata={"Software": None})  # no version string: the same bytes


def curve_band(study: Study, arm: str, key: str, resamples: int) -> tuple[list[int], list[stats.Estimate]]:
    """Per step (with a value in any seed): the mean over the arm's seeds and its bootstrap interval."""
    per_seed = [dict(zip(*curve(r, key), strict=True)) for r in study.runs[arm].values()]
    steps = sorted({s for c in per_seed for s in c})
    ests = []
    for s in steps:
        v = [c[s] for c in per_seed if s in c and math.isfinite(c[s])]
        ests.append(stats.bootstrap_ci(v, resamples=resamples))
    return steps, ests


def plot_curves(study: Study, key: str, title: str, path: str, resamples: int) -> bool:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for i, arm in enumerate(study.arms):
        steps, ests = curve_band(study, arm, key, resamples)
        keep = [(s, e) for s, e in zip(steps, ests, strict=True) if e.n]
        if not keep:
            continue
        x = [s for s, _ in keep]
        mean, lo, hi = ([getattr(e, f) for _, e in keep] for f in ("value", "low", "high"))
        color = f"C{i % 10}"
        n = len(study.runs[arm])
        ax.plot(
            x, mean, color=color, marker="o" if len(x) < 12 else None, ms=3, lw=1.2, label=f"{arm} (n={n})"
        )
        ax.fill_between(x, lo, hi, color=color, alpha=0.18, lw=0)
        drawn = True
    if drawn:
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(key)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        _save(fig, path)
    plt.close(fig)
    return drawn


def plot_bars(values: dict[str, dict[int, float]], baseline: str, label: str, path: str, resamples: int):
    """Left: each arm's mean with its interval (the seeds as dots); right: the paired Δ vs the baseline."""
    plt = _pyplot()
    arms = [a for a in values if values[a]]
    others = [a for a in arms if a != baseline and stats.paired_differences(values[a], values[baseline])[0]]
    fig, axes = plt.subplots(1, 2 if others else 1, figsize=(9 if others else 5, 3.6), squeeze=False)
    ax1 = axes[0][0]
    for i, arm in enumerate(arms):
        v = [values[arm][s] for s in sorted(values[arm])]
        e = stats.bootstrap_ci(v, resamples=resamples)
        ax1.bar(i, e.value, color=f"C{i % 10}", alpha=0.8)
        ax1.errorbar(i, e.value, yerr=[[e.value - e.low], [e.high - e.value]], color="k", capsize=4)
        ax1.plot([i + 0.25] * e.n, v, "k.", ms=4, alpha=0.7)
    ax1.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
    ax1.set_title(f"{label}: mean over seeds, 95 % CI")
    if others:
        ax2 = axes[0][1]
        for j, arm in enumerate(others):
            e = stats.paired_bootstrap_ci(values[arm], values[baseline], resamples=resamples)
            ax2.bar(j, e.value, color=f"C{arms.index(arm) % 10}", alpha=0.8)
            ax2.errorbar(j, e.value, yerr=[[e.value - e.low], [e.high - e.value]], color="k", capsize=4)
        ax2.axhline(0.0, color="k", lw=0.8)
        ax2.set_xticks(range(len(others)), others, rotation=30, ha="right")
        ax2.set_title(f"paired Δ vs {baseline}, 95 % CI")
    for ax in axes[0]:
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------------------


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s.replace("@", "_at_")).strip("_")


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """write_report's choices (the report's definitions: fix them before looking at the results)."""

    runs_dir: str
    out: str
    baseline: str
    resamples: int = stats.DEFAULT_RESAMPLES
    last_steps: int = 10
    threshold: float | None = None
    threshold_metric: str = "eval/pass_at_1"
    collapse_entropy: float | None = None
    collapse_k: int | None = None
    evals_before: str | None = None


def write_report(
    runs_dir: str,
    out: str | None = None,
    baseline: str | None = None,
    *,
    resamples: int = stats.DEFAULT_RESAMPLES,
    last_steps: int = 10,
    threshold: float | None = None,
    threshold_metric: str = "eval/pass_at_1",
    collapse_entropy: float | None = None,
    collapse_k: int | None = None,
    evals_before: str | None = None,
) -> str:
    """Write report.md and its PNGs to `out` (default RUNS_DIR/report); returns the report's path. The report
    is its sections in order (each a function below returning markdown lines)."""
    study = load_study(runs_dir)
    folded = add_evals(study, evals_before)
    finished = [a for a in study.arms if study.runs[a]]
    if not finished:
        raise ValueError(f"no finished run (results.json with a final evaluation) under {runs_dir}")
    if baseline is None:
        baseline = "baseline" if "baseline" in study.arms else study.arms[0]
    if baseline not in study.arms:
        raise ValueError(f"--baseline={baseline}: not an arm of {runs_dir} (arms: {', '.join(study.arms)})")
    o = ReportOptions(
        runs_dir,
        out or os.path.join(runs_dir, "report"),
        baseline,
        resamples,
        last_steps,
        threshold,
        threshold_metric,
        collapse_entropy,
        collapse_k,
        evals_before,
    )
    os.makedirs(o.out, exist_ok=True)
    ks = pass_ks(study)
    metrics = report_metrics(study, ks, last_steps)
    md = _header(study, o)
    md += _arms_section(study, o)
    md += _metric_sections(study, o, metrics)
    md += _before_after_section(study, o, folded)
    md += _curves_section(study, o)
    md += _threshold_section(study, o)
    md += _collapse_section(study, o, ks)
    p1 = metric_values(study, metrics[0][2])
    md += ["", "## Per seed: held-out pass@1 after GRPO", "", per_seed_table(p1, study.seeds)]
    md += _missing_and_commands(study)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(md)).rstrip() + "\n"
    path = os.path.join(o.out, "report.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def report_metrics(study: Study, ks: list[int], last_steps: int) -> list:
    """(title, PNG slug or None, run -> value) of every metric table, in report order."""
    metrics = [
        ("held-out pass@1 (greedy) after GRPO", "pass_at_1", lambda r: r.results["grpo"].get("pass@1"))
    ]
    metrics += [
        (
            f"held-out pass@{k} (sampled) after GRPO",
            f"pass_at_{k}",
            lambda r, k=k: r.results["grpo"].get(f"pass@{k}"),
        )
        for k in ks
        if k > 1
    ]
    metrics += turn_metric_rows(study, last_steps)
    metrics += [
        (
            "held-out pass@1 (greedy) after SFT, the start of GRPO",
            None,
            lambda r: r.results.get("sft", {}).get("pass@1"),
        ),
        (
            f"training reward, mean of the last {last_steps} steps",
            None,
            lambda r: last_mean(r, "reward", last_steps),
        ),
        (
            f"policy entropy, mean of the last {last_steps} steps",
            None,
            lambda r: last_mean(r, "entropy", last_steps),
        ),
        ("median GRPO step time (s)", "step_s", lambda r: r.results.get("median_step_s_this_process")),
        (
            "peak host memory by the last GRPO step (RSS, MiB)",
            "host_peak_rss_mb",
            lambda r: r.results.get("memory_grpo_this_process", {}).get("memory/host_peak_rss_mb"),
        ),
        (
            "peak device memory by the last GRPO step (allocator, MiB)",
            "device_peak_mb",
            lambda r: r.results.get("memory_grpo_this_process", {}).get("memory/device_peak_mb"),
        ),
    ]
    return metrics


def regenerate_command(o: ReportOptions) -> str:
    """The command line that writes this report again."""
    cmd = f"python -m experiments.report {o.runs_dir} --baseline={o.baseline}"
    if o.out != os.path.join(o.runs_dir, "report"):
        cmd += f" --out={o.out}"
    if o.resamples != stats.DEFAULT_RESAMPLES:
        cmd += f" --resamples={o.resamples}"
    if o.last_steps != 10:
        cmd += f" --last_steps={o.last_steps}"
    if o.threshold is not None:
        cmd += f" --threshold={o.threshold} --threshold_metric={o.threshold_metric}"
    if o.evals_before:
        cmd += f" --evals_before={o.evals_before}"
    if o.collapse_entropy is not None:
        cmd += f" --collapse_entropy={o.collapse_entropy}" + (
            f" --collapse_k={o.collapse_k}" if o.collapse_k else ""
        )
    return cmd


def _header(study: Study, o: ReportOptions) -> list[str]:
    n_fin = sum(len(v) for v in study.runs.values())
    return [
        f"# Sweep report: {o.runs_dir}",
        "",
        f"{n_fin} finished runs of {len(study.arms)} arms × {len(study.seeds)} seeds "
        f"({', '.join(map(str, study.seeds))}); runs from {study.source}. Baseline arm: **{o.baseline}**.",
        "",
        f"Intervals: 95 % percentile bootstrap over seeds ({o.resamples} resamples, RNG seed 0; "
        f"grpo_jax.stats). Δ = arm − {o.baseline} paired by seed, over the seeds both finished; "
        "'seeds Δ > 0' counts the seeds where the arm's value is the higher one (better for pass rates and "
        "reward, worse for time and memory). With few seeds the percentile bootstrap tends to be too narrow "
        "(it cannot reach beyond the values seen).",
        "",
        f"Regenerate: `{regenerate_command(o)}`",
    ]


def _arms_section(study: Study, o: ReportOptions) -> list[str]:
    diffs = config_differences(study, o.baseline)
    if not diffs:
        return []
    md = ["", "## Arms", ""]
    md += [f"Configuration fields where each arm differs from {o.baseline} (results.json):", ""]
    return md + [f"- **{a}**: " + (", ".join(f"`{d}`" for d in v) if v else "none") for a, v in diffs.items()]


def _metric_sections(study: Study, o: ReportOptions, metrics: list) -> list[str]:
    md: list[str] = []
    for title, slug, fn in metrics:
        values = metric_values(study, fn)
        if not any(values.values()):
            continue
        fmt = ".2f" if "time" in title else ".0f" if "MiB" in title else ".3f"
        md += ["", f"## {title}", "", metric_table(values, o.baseline, o.resamples, fmt)]
        if slug:
            png = f"bars_{slug}.png"
            plot_bars(values, o.baseline, title.split(" (")[0], os.path.join(o.out, png), o.resamples)
            md += ["", f"![{title}]({png})"]
    return md


def _before_after_section(study: Study, o: ReportOptions, folded: list[str]) -> list[str]:
    ba_keys = before_after_keys(study)
    if not ba_keys:
        return []
    md = [
        "",
        "## Before and after GRPO, paired by seed",
        "",
        'Every evaluation measured both at the start of GRPO (results.json "sft": after SFT, or the '
        'initial checkpoint with --sft_steps=0) and after the last step ("grpo"): held-out greedy '
        "pass@1, sampled pass@k and the extra sets' greedy pass@1 (mbpp/, humaneval/). Δ = after − "
        "before per seed, bootstrap over the seeds.",
        "",
        before_after_table(study, ba_keys, o.resamples),
    ]
    if folded:
        src = "greedy pass@1 of each run's final checkpoint by experiments.evaluate, <workdir>/evals/NAME"
        if o.evals_before:
            src += f"; before: {o.evals_before}/NAME, the initial policy"
        md[-2:-2] = [f"From {src}: {', '.join(folded)}.", ""]
    return md


def _curves_section(study: Study, o: ReportOptions) -> list[str]:
    md = ["", "## Learning curves", ""]
    heldout = o.threshold_metric
    for key, title in (("reward", "training reward (mean over the batch)"), (heldout, f"held-out {heldout}")):
        png = f"curve_{_slug(key)}.png"
        band = f"{title}: mean over seeds, 95 % bootstrap band"
        if plot_curves(study, key, band, os.path.join(o.out, png), o.resamples):
            md += [f"![{title}]({png})", ""]
    return md


def _threshold_section(study: Study, o: ReportOptions) -> list[str]:
    if o.threshold is None:
        return []
    return [
        "",
        f"## Completions to {o.threshold_metric} ≥ {o.threshold}",
        "",
        f"Completions sampled until the first evaluated step with {o.threshold_metric} ≥ {o.threshold}: that "
        "step × prompts_per_step × group_size (nominal: dynamic-sampling refills and pool members sample "
        "more; 0 = already at the start). The evaluated steps are step 0, every --eval_every steps and "
        "the last.",
        "",
        threshold_table(study, o.threshold, o.threshold_metric),
    ]


def _collapse_section(study: Study, o: ReportOptions, ks: list[int]) -> list[str]:
    if o.collapse_entropy is None:
        return []
    k = o.collapse_k or (max(ks) if ks else 1)
    return [
        "",
        "## Collapse",
        "",
        f"A run collapsed when its mean policy entropy over the last {o.last_steps} GRPO steps is below "
        f"{o.collapse_entropy} and its final held-out pass@{k} is below its post-SFT pass@{k}.",
        "",
        collapse_table(study, o.collapse_entropy, k, o.last_steps),
    ]


def _missing_and_commands(study: Study) -> list[str]:
    md: list[str] = []
    if study.missing:
        md += ["", "## Missing runs (left out of every number)", ""]
        md += [f"- {a} seed {s}: {why}" for a, s, why in study.missing]
    if study.commands:
        md += [
            "",
            "## Commands (each arm's first seed, from the manifest; the other seeds differ in --seed,",
            "",
        ]
        md[-2] += " --workdir and --sft_from)"
        md += [f"- {a}: `python {' '.join(c[1:])}`" for a, c in study.commands.items()]
    return md


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("usage: python -m experiments.report RUNS_DIR [--baseline=ARM] [--out=DIR]")
    runs_dir = argv[1].rstrip("/") or "/"
    if not os.path.isdir(runs_dir):
        _fail(f"{runs_dir}: not a directory")
    try:
        path = write_report(
            runs_dir,
            FLAGS.out,
            FLAGS.baseline,
            resamples=FLAGS.resamples,
            last_steps=FLAGS.last_steps,
            threshold=FLAGS.threshold,
            threshold_metric=FLAGS.threshold_metric,
            collapse_entropy=FLAGS.collapse_entropy,
            collapse_k=FLAGS.collapse_k,
            evals_before=FLAGS.evals_before,
        )
    except ValueError as e:
        _fail(str(e))
    print(path)


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
