"""experiments.report on a synthetic sweep directory in the main job's file formats (results.json,
metrics.jsonl, the sweep's manifest.json): the numbers of report.md, valid PNGs, identical regeneration."""

from __future__ import annotations

import json
import os
import re

import pytest

from experiments import report
from grpo_jax import stats

PASS1 = {  # held-out pass@1 after GRPO per arm and seed; mech seed 4 did not finish
    "baseline": {0: 0.30, 1: 0.20, 2: 0.40, 3: 0.10, 4: 0.25},
    "mech": {0: 0.31, 1: 0.22, 2: 0.43, 3: 0.14},
}
SFT_P1 = {0: 0.05, 1: 0.06, 2: 0.07, 3: 0.08, 4: 0.09}  # one shared warm start per seed
STEPS = 12


def _config(arm: str, seed: int, wd: str) -> dict:
    return {
        "workdir": wd,
        "seed": seed,
        "steps": STEPS,
        "sft": {"steps": 100, "from_workdir": f"R/_warm/w/s{seed}"},
        "rollout": {"prompts_per_step": 16, "group_size": 8},
        "replay": {"fraction": 0.25 if arm == "mech" else 0.0},
    }


def _write_run(runs, arm: str, seed: int, finished: bool = True) -> None:
    wd = runs / arm / f"s{seed}"
    wd.mkdir(parents=True)
    cfg = _config(arm, seed, str(wd))
    (wd / "run.json").write_text(json.dumps({"config": cfg, "argv": ["codegen.py"]}))
    collapse = arm == "mech" and seed == 1  # entropy falls to 0.01 and pass@8 drops below its post-SFT value
    p8_before, p8_after = 0.5, (0.4 if collapse else 0.6)
    lines = [{"step": 0, "time": 1.0, "eval/pass_at_1": SFT_P1[seed], "eval/pass_at_8": p8_before}]
    for step in range(1, STEPS + 1):
        reward = 0.5 + 0.1 * seed + (0.05 if arm == "mech" else 0.0) + 0.01 * (step - STEPS)
        entropy = 0.01 if collapse or (arm, seed) == ("baseline", 2) else 0.2  # baseline s2: low entropy only
        lines.append({"step": step, "time": 1.0 + step, "reward": reward, "entropy": entropy, "kl": "nan"})
    # a mid-run evaluation (--eval_every=6): baseline s0 reaches 0.30 here already
    lines.append({"step": 6, "time": 7.5, "eval/pass_at_1": 0.30 if (arm, seed) == ("baseline", 0) else 0.01})
    p1 = PASS1[arm].get(seed, 0.0)
    if finished:
        lines.append({"step": STEPS, "time": 20.0, "eval/pass_at_1": p1, "eval/pass_at_8": p8_after})
    with open(wd / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)
        f.write('{"step": 13, "rew')  # a line cut by a crash is skipped
    if finished:
        res = {
            "sft_from": f"R/_warm/w/s{seed}",
            "sft": {"pass@1": SFT_P1[seed], "pass@8": p8_before, "mbpp/pass@1": 0.2},
            "grpo": {"pass@1": p1, "pass@8": p8_after, "pass@1/sampled": p1 / 2},
            "grpo_eval_step": STEPS,
            "median_step_s_this_process": 0.5 if arm == "baseline" else 0.7,
            "memory_grpo_this_process": {"memory/host_peak_rss_mb": 900.0 + 10 * seed + 60 * (arm == "mech")},
            "steps": STEPS,
            "config": cfg,
        }
        res["grpo"]["mbpp/pass@1"] = 0.2 + 0.02 * seed
        (wd / "results.json").write_text(json.dumps(res))


@pytest.fixture
def runs(tmp_path):
    runs = tmp_path / "runs"
    points = []
    for seed in range(5):
        for arm in ("baseline", "mech"):
            _write_run(runs, arm, seed, finished=(arm, seed) != ("mech", 4))
            cmd = ["/x/python", "-m", "experiments.codegen", f"--arm={arm}", f"--seed={seed}"]
            points.append({"id": f"{arm}/s{seed}", "kind": "run", "arm": arm, "seed": seed, "command": cmd})
    manifest = {"grid": "g.json", "arms": ["baseline", "mech"], "seeds": [0, 1, 2, 3, 4], "points": points}
    (runs / "manifest.json").write_text(json.dumps(manifest))
    return runs


def _row(md: str, section: str, arm: str) -> list[str]:
    body = md.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    line = next(x for x in body.splitlines() if x.startswith(f"| {arm} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_report_numbers_plots_and_identical_regeneration(runs):
    path = report.write_report(
        str(runs), resamples=10_000, threshold=0.3, collapse_entropy=0.05, collapse_k=8, last_steps=10
    )
    md = open(path, encoding="utf-8").read()
    out = os.path.dirname(path)
    p1 = "held-out pass@1 (greedy) after GRPO"
    # baseline over 5 seeds: mean 0.25; its interval from grpo_jax.stats (tested with literal values there)
    b = stats.bootstrap_ci([0.30, 0.20, 0.40, 0.10, 0.25])
    assert _row(md, p1, "baseline") == ["baseline", "5", "0.250", f"[{b.low:.3f}, {b.high:.3f}]", "", "", ""]
    # mech over its 4 finished seeds: mean 0.275; paired with the baseline on seeds 0-3 the differences are
    # 0.01, 0.02, 0.03, 0.04: mean +0.025 with the exact bootstrap interval [0.015, 0.035] of
    # tests/test_stats.py, better on 4 of 4 (unpaired, the spread of the seeds would widen it to ~±0.1)
    m = stats.bootstrap_ci([0.31, 0.22, 0.43, 0.14])
    assert _row(md, p1, "mech") == ["mech", "4", "0.275", f"[{m.low:.3f}, {m.high:.3f}]", "+0.025",
                                    "[+0.015, +0.035]", "4/4"]  # fmt: skip
    # pass@8 after GRPO: 0.6 everywhere but the collapsed mech s1 (0.4): mech mean 0.55, Δ −0.05 on 1 seed
    assert _row(md, "held-out pass@8 (sampled) after GRPO", "mech")[2:7:2] == ["0.550", "-0.050", "0/4"]
    # the shared warm start: the same post-SFT pass@1 per seed, Δ exactly 0
    assert _row(md, "held-out pass@1 (greedy) after SFT, the start of GRPO", "mech")[4:] == [
        "+0.000", "[+0.000, +0.000]", "0/4",
    ]  # fmt: skip
    # training reward at step t: 0.5 + 0.1·seed (+0.05 for mech) + 0.01·(t − 12); over the last 10 steps
    # (3..12) the last term averages −0.045: baseline over seeds 0-4 0.7 − 0.045 = 0.655, mech over seeds 0-3
    # (0.55 + 0.65 + 0.75 + 0.85) / 4 − 0.045 = 0.655, paired Δ +0.050 (the first 10 steps would give 0.635)
    reward = "training reward, mean of the last 10 steps"
    assert _row(md, reward, "baseline")[2] == "0.655"
    assert _row(md, reward, "mech")[2:5:2] == ["0.655", "+0.050"]
    # entropy 0.2, but 0.01 for mech s1 and baseline s2: baseline (4·0.2 + 0.01) / 5 = 0.162, mech over seeds
    # 0-3 0.1525 (printed 0.152 or 0.153 by rounding), paired Δ (0 − 0.19 + 0.19 + 0) / 4 = 0
    ent = "policy entropy, mean of the last 10 steps"
    assert _row(md, ent, "baseline")[2] == "0.162" and _row(md, ent, "mech")[4] in ("+0.000", "-0.000")
    assert _row(md, "median GRPO step time (s)", "mech")[2:5:2] == ["0.70", "+0.20"]
    # host memory: 900 + 10·seed (+60 for mech): baseline over seeds 0-4 920, mech over 0-3 975, Δ +60;
    # no run has a device figure (CPU), so there is no device-memory table
    rss = "peak host memory by the last GRPO step (RSS, MiB)"
    assert _row(md, rss, "baseline")[2] == "920" and _row(md, rss, "mech")[2:7:2] == ["975", "+60", "4/4"]
    assert "peak device memory" not in md
    # completions to held-out pass@1 >= 0.3: baseline s0 at step 6 (6 x 16 x 8 = 768), s2 at the end (12 x 128
    # = 1 536); s1, s3, s4 end below it: median of 768, 1 536, inf, inf, inf = inf. mech: s0 (0.31) and s2
    # (0.43) at the end, median of 1 536, 1 536, inf, inf = inf
    thr = _row(md, "Completions to eval/pass_at_1 ≥ 0.3", "baseline")
    assert thr[:3] == ["baseline", "5", "2/5"] and thr[4] == "not reached"
    assert thr[5] == "s0 768, s1 not reached, s2 1 536, s3 not reached, s4 not reached"
    mech_thr = _row(md, "Completions to eval/pass_at_1 ≥ 0.3", "mech")
    assert mech_thr[2:5:2] == ["2/4", "not reached"] and mech_thr[5].startswith("s0 1 536, s1 not reached")
    # the rate of seeds that reached it, 2 of 5, Wilson: z²/n = 0.76829, centre (0.4 + 0.38415) / 1.76829 =
    # 0.44345, half 1.10839 · sqrt(0.048 + 0.038415) = 0.32583: [0.118, 0.769]
    assert thr[3] == "[0.12, 0.77]"
    # collapse: mech s1 only (baseline s2 has the low entropy but not the fall in pass@8); 1 of 4 with the
    # Wilson interval [0.046, 0.699] (z² = 3.8415: centre (0.25 + 0.4802) / 1.9604 = 0.3725,
    # half 0.99978 · sqrt(0.046875 + 0.060023) = 0.3269)
    assert _row(md, "Collapse", "mech") == ["mech", "4", "1/4", "0.25", "[0.05, 0.70]", "s1"]
    assert _row(md, "Collapse", "baseline")[2:] == ["0/5", "0.00", "[0.00, 0.43]", "none"]
    # before -> after GRPO paired by seed, one row per arm and metric measured at both ends (pass@1/sampled
    # is only in "grpo": no row). baseline pass@1: before 0.05..0.09 (mean 0.070), after mean 0.250, per-seed
    # differences 0.25, 0.14, 0.33, 0.02, 0.16: mean +0.180, all 5 rose. mbpp: 0.2 before, 0.2 + 0.02·seed
    # after: Δ 0, .02, .04, .06, .08 = +0.040, 4 of 5 rose (seed 0 is equal).
    ba = md.split("## Before and after GRPO, paired by seed\n", 1)[1].split("\n## ", 1)[0]
    cells = [[c.strip() for c in x.strip("|").split("|")] for x in ba.splitlines()]
    rows = {(c[0], c[1]): c for c in cells if c[0] in ("baseline", "mech")}
    assert [k for k in rows if k[0] == "baseline"] == [
        ("baseline", "pass@1"), ("baseline", "pass@8"), ("baseline", "mbpp/pass@1"),
    ]  # fmt: skip
    r = rows["baseline", "pass@1"]
    assert r[2:4] + r[5:6] + r[7:8] + r[9:] == ["5", "0.070", "0.250", "+0.180", "5/5"]
    d = stats.bootstrap_ci([0.25, 0.14, 0.33, 0.02, 0.16])
    assert r[8] == f"[{d.low:+.3f}, {d.high:+.3f}]"
    assert rows["baseline", "mbpp/pass@1"][7:8] + rows["baseline", "mbpp/pass@1"][9:] == ["+0.040", "4/5"]
    # mech s1 collapsed: pass@8 0.5 -> 0.4; the other 3 seeds 0.5 -> 0.6: Δ (0.1·3 − 0.1) / 4 = +0.050, 3/4
    assert rows["mech", "pass@8"][2] == "4" and rows["mech", "pass@8"][7:8] + rows["mech", "pass@8"][9:] == [
        "+0.050", "3/4",
    ]  # fmt: skip
    # arms, missing runs, commands, per-seed table
    assert "- **mech**: `replay.fraction=0.25`" in md
    assert "- mech seed 4: no results.json (not run or not finished)" in md
    assert "- mech: `python -m experiments.codegen --arm=mech --seed=0`" in md
    assert "| mech | 0.310 | 0.220 | 0.430 | 0.140 | - |" in md
    # the PNGs it links exist and are valid images
    from PIL import Image

    pngs = re.findall(r"\]\(([^)]+\.png)\)", md)
    assert sorted(pngs) == [
        "bars_host_peak_rss_mb.png",
        "bars_pass_at_1.png",
        "bars_pass_at_8.png",
        "bars_step_s.png",
        "curve_eval_pass_at_1.png",
        "curve_reward.png",
    ]
    for name in pngs:
        with Image.open(os.path.join(out, name)) as im:
            im.verify()
            assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200
    # regenerated from the same runs: the same bytes
    before = {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))}
    report.write_report(
        str(runs), resamples=10_000, threshold=0.3, collapse_entropy=0.05, collapse_k=8, last_steps=10
    )
    assert {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))} == before


def test_layout_without_manifest_and_errors(tmp_path):
    runs = tmp_path / "ablate"  # launch/ablate.sh's <arm>_s<seed> next to the sweep's <arm>/s<seed>
    for arm, seed, p1 in (("baseline", 0, 0.2), ("baseline", 10, 0.4), ("replay", 0, 0.3)):
        d = runs / f"{arm}_s{seed}"
        d.mkdir(parents=True)
        (d / "results.json").write_text(json.dumps({"grpo": {"pass@1": p1}, "sft": {"pass@1": 0.1}}))
    (runs / "replay_s1").mkdir()  # not finished
    (runs / "_warm" / "w" / "s0").mkdir(parents=True)  # warm starts are not arms
    (runs / "pool" / "s2").mkdir(parents=True)
    (runs / "pool" / "s2" / "results.json").write_text(json.dumps({"grpo": {"pass@1": 0.5}}))
    study = report.load_study(str(runs))
    assert study.arms == ["baseline", "pool", "replay"] and study.seeds == [0, 2, 10]
    assert list(study.runs["baseline"]) == [0, 10]  # numeric seed order (not "s10" < "s2")
    md = open(report.write_report(str(runs), str(tmp_path / "out")), encoding="utf-8").read()
    assert "runs from the directory layout (no manifest.json)" in md
    assert "| replay | 1 | 0.300 | [0.300, 0.300] | +0.100 | [+0.100, +0.100] | 1/1 |" in md
    with pytest.raises(
        ValueError, match=r"--baseline=nope: not an arm of .* \(arms: baseline, pool, replay\)"
    ):
        report.write_report(str(runs), str(tmp_path / "out"), baseline="nope")
    with pytest.raises(ValueError, match="no finished run"):
        report.write_report(str(tmp_path / "ablate" / "_warm"), str(tmp_path / "o2"))


def test_evaluate_outputs_fold_into_the_before_after_table(runs, tmp_path):
    """experiments.evaluate outputs in <workdir>/evals/NAME (a run's final checkpoint) and
    --evals_before/NAME (the initial policy) become NAME/pass@1 after and before GRPO; an evaluation of
    another step is ignored."""

    def write(d, p1, step=None):
        d.mkdir(parents=True)
        policy = {"init_from": "m"} if step is None else {"checkpoint": "x", "step": step}
        (d / "results.json").write_text(json.dumps({"policy": policy, "metrics": {"greedy/pass@1": p1}}))

    for seed in range(5):  # seed 4 evaluated a checkpoint of step 3, not its final step 12: left out
        d = runs / "baseline" / f"s{seed}" / "evals" / "humaneval"
        write(d, 0.1 + 0.01 * seed, STEPS if seed < 4 else 3)
    write(tmp_path / "base" / "humaneval", 0.1)
    path = report.write_report(str(runs), out=str(tmp_path / "rep"), evals_before=str(tmp_path / "base"))
    md = open(path, encoding="utf-8").read()
    ba = md.split("## Before and after GRPO, paired by seed\n", 1)[1].split("\n## ", 1)[0]
    row = next(x for x in ba.splitlines() if x.startswith("| baseline | humaneval/pass@1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # seeds 0-3: before 0.1 each, after 0.10, 0.11, 0.12, 0.13: mean 0.115, Δ +0.015, 3 of 4 rose (s0 equal)
    assert cells[2:4] + cells[5:6] + cells[7:8] + cells[9:] == ["4", "0.100", "0.115", "+0.015", "3/4"]
    assert "From greedy pass@1 of each run's final checkpoint by experiments.evaluate" in ba
    assert "--evals_before=" in md.split("Regenerate:", 1)[1].split("\n", 1)[0]
    assert not any(x.startswith("| mech | humaneval/") for x in ba.splitlines())  # mech has no evals


def test_multi_turn_rows(runs):
    """Runs evaluated with execution feedback: held-out pass@1 after turn 2, the fix rate and the sampled
    tokens per step get their own tables (baseline turn2 = pass@1 + 0.05, mech + 0.10; fix rate 0.1 / 0.2;
    tokens 3 000 / 2 500 per step)."""
    for d in sorted(runs.glob("*/s*")):
        arm, res_path = d.parent.name, d / "results.json"
        if not res_path.exists():
            continue
        res = json.loads(res_path.read_text())
        extra = 0.05 if arm == "baseline" else 0.10
        res["grpo"].update(
            {"turn1/pass@1": res["grpo"]["pass@1"], "turn2/pass@1": res["grpo"]["pass@1"] + extra}
        )
        res["grpo"]["fix_rate"] = 0.1 if arm == "baseline" else 0.2
        res_path.write_text(json.dumps(res))
        with open(d / "metrics.jsonl", "a") as f:
            f.write("\n")  # after the cut line
            for step in range(1, STEPS + 1):
                f.write(
                    json.dumps({"step": step, "rollout/sampled_tokens": 3000 if arm == "baseline" else 2500})
                    + "\n"
                )
    md = open(report.write_report(str(runs), resamples=2_000), encoding="utf-8").read()
    t2 = "held-out pass@1 (greedy) after turn 2 (execution feedback), after GRPO"
    assert _row(md, t2, "baseline")[2] == "0.300" and _row(md, t2, "mech")[2:5:2] == ["0.375", "+0.075"]
    fix = "held-out fix rate (greedy: of the problems failed at turn 1, the share a later turn passed)"
    assert _row(md, fix, "mech")[2:5:2] == ["0.200", "+0.100"]
    tok = "model tokens sampled per step, mean of the last 10 steps"
    assert _row(md, tok, "baseline")[2] == "3000.000" and _row(md, tok, "mech")[4] == "-500.000"
