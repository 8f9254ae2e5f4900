"""Summarise ablation runs (launch/ablate.sh) as a markdown table.

    python -m experiments.ablation_table                 # reads runs/ablate/<mechanism>_s<seed>/results.json
    python -m experiments.ablation_table --root=runs/ablate --baseline=baseline

One row per mechanism: held-out pass@1 (greedy) after GRPO for each seed, its mean, the mean paired
difference to the baseline arm (same seed = same SFT start), how many seeds improved, pass@8 likewise, and
the median GRPO step time. Missing or unfinished runs are shown as "-" and left out of the means.
"""

from __future__ import annotations

import json
import os
import re
import statistics

from absl import app, flags

flags.DEFINE_string("root", "runs/ablate", "Directory holding <mechanism>_s<seed>/results.json.")
flags.DEFINE_string("baseline", "baseline", "Mechanism name of the arm without any mechanism.")
FLAGS = flags.FLAGS


def load(root: str) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = {}
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        m = re.fullmatch(r"(.+)_s(\d+)", name)
        path = os.path.join(root, name, "results.json")
        if m and os.path.exists(path):
            with open(path) as f:
                r = json.load(f)
            if "grpo" in r:
                runs.setdefault(m.group(1), {})[int(m.group(2))] = r
    return runs


def table(runs: dict[str, dict[int, dict]], baseline: str) -> str:
    seeds = sorted({s for arm in runs.values() for s in arm})
    base = runs.get(baseline, {})
    head = (
        ["mechanism"]
        + [f"pass@1 s{s}" for s in seeds]
        + ["mean", "Δ vs base", "better", "pass@8 mean", "Δ pass@8", "step s"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = [baseline] + sorted(k for k in runs if k != baseline)
    for mech in order:
        arm = runs.get(mech, {})
        if not arm:
            continue
        p1 = {s: arm[s]["grpo"]["pass@1"] for s in arm}
        p8 = {s: arm[s]["grpo"].get("pass@8", float("nan")) for s in arm}
        paired = [s for s in arm if s in base]
        d1 = [p1[s] - base[s]["grpo"]["pass@1"] for s in paired]
        d8 = [p8[s] - base[s]["grpo"].get("pass@8", float("nan")) for s in paired]
        steps = [
            arm[s].get("median_step_s_this_process") for s in arm if arm[s].get("median_step_s_this_process")
        ]
        cells = [mech] + [f"{p1[s]:.3f}" if s in p1 else "-" for s in seeds]
        cells += [
            f"{statistics.mean(p1.values()):.3f}",
            "" if mech == baseline or not d1 else f"{statistics.mean(d1):+.3f}",
            "" if mech == baseline or not d1 else f"{sum(d > 0 for d in d1)}/{len(d1)}",
            f"{statistics.mean(p8.values()):.3f}",
            "" if mech == baseline or not d8 else f"{statistics.mean(d8):+.3f}",
            f"{statistics.median(steps):.2f}" if steps else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv):
    del argv
    runs = load(FLAGS.root)
    if not runs:
        raise SystemExit(f"error: no finished runs (results.json with a 'grpo' entry) under {FLAGS.root}")
    print(table(runs, FLAGS.baseline))


if __name__ == "__main__":
    app.run(main)
