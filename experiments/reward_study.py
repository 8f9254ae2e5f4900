"""The reward study's figures that experiments.report does not give: how many replies parse, per arm.

    python -m experiments.reward_study runs/rewards            # after experiments/sweeps/rewards.json

Per arm (DIR/<arm>/s<seed>, every finished seed), the mean over seeds with a 95 % bootstrap interval
(grpo_jax.stats, RNG seed 0) of:
  - held-out pass@1 (greedy) after GRPO (results.json "grpo"), and its paired difference with the first arm;
  - the share of training replies that parse: 1 − syntax errors / programs graded over the GRPO steps
    (metrics.jsonl's sandbox/<status> counts; a program that does not parse is the sandbox's syntax_error);
  - the share of held-out greedy replies that parse, before and after GRPO (the main job's
    eval/step_<N>/heldout_greedy.jsonl, status != syntax_error).
Prints a markdown table.
"""

from __future__ import annotations

import json
import os
import re

from absl import app

from grpo_jax import stats
from grpo_jax.codegen.datasets import read_jsonl
from grpo_jax.sandbox.types import Status


def train_parse_share(wd: str) -> float:
    """1 − syntax errors / programs over the run's train-step rows of metrics.jsonl."""
    rows = [r for r in read_jsonl(os.path.join(wd, "metrics.jsonl")) if "sandbox/syntax_error" in r]
    total = sum(sum(r[f"sandbox/{s.value}"] for s in Status) for r in rows)
    return 1.0 - sum(r["sandbox/syntax_error"] for r in rows) / max(total, 1)


def heldout_parse_share(wd: str, step: int) -> float:
    rows = read_jsonl(os.path.join(wd, "eval", f"step_{step}", "heldout_greedy.jsonl"))
    return sum(r["status"] != Status.SYNTAX_ERROR.value for r in rows) / max(len(rows), 1)


def collect(runs_dir: str) -> dict[str, dict[str, dict[int, float]]]:
    """{arm: {figure: {seed: value}}} over the finished points of a sweep directory, arms in the grid's order
    (manifest.json)."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    manifest = os.path.join(runs_dir, "manifest.json")
    order = sorted(os.listdir(runs_dir))
    if os.path.exists(manifest):  # the grid's order: its first arm is the baseline
        with open(manifest, encoding="utf-8") as f:
            order = list(json.load(f)["arms"])
    for arm in order:
        adir = os.path.join(runs_dir, arm)
        if arm.startswith("_") or not os.path.isdir(adir):
            continue
        for point in sorted(os.listdir(adir)):
            m, wd = re.fullmatch(r"s(\d+)", point), os.path.join(adir, point)
            if not m or not os.path.exists(os.path.join(wd, "results.json")):
                continue
            seed = int(m.group(1))
            with open(os.path.join(wd, "results.json"), encoding="utf-8") as f:
                res = json.load(f)
            figs = out.setdefault(arm, {})
            figs.setdefault("heldout pass@1 after GRPO", {})[seed] = res["grpo"]["pass@1"]
            figs.setdefault("training replies that parse", {})[seed] = train_parse_share(wd)
            figs.setdefault("held-out replies that parse, after SFT", {})[seed] = heldout_parse_share(wd, 0)
            figs.setdefault("held-out replies that parse, after GRPO", {})[seed] = heldout_parse_share(
                wd, res["steps"]
            )
    return out


def table(data: dict[str, dict[str, dict[int, float]]]) -> str:
    """The markdown table; Δ paired by seed against the first arm (the grid's first)."""
    arms = list(data)
    base = arms[0]
    lines = [
        f"| arm | figure | seeds | mean [95 % CI] | Δ vs {base} [95 % CI] |",
        "|---|---|---|---|---|",
    ]
    for arm in arms:
        for fig, vals in data[arm].items():
            e = stats.bootstrap_ci(list(vals.values()))
            d = "" if arm == base else stats.paired_bootstrap_ci(vals, data[base][fig])
            ds = "" if d == "" else f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
            lines.append(
                f"| {arm} | {fig} | {len(vals)} | {e.value:.3f} [{e.low:.3f}, {e.high:.3f}] | {ds} |"
            )
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("usage: python -m experiments.reward_study RUNS_DIR")
    data = collect(argv[1])
    if not data:
        raise app.UsageError(f"{argv[1]}: no finished run (DIR/<arm>/s<seed>/results.json)")
    print(table(data))


if __name__ == "__main__":
    app.run(main)
