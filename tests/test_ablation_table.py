"""experiments.ablation_table: paired differences to the baseline arm, unfinished runs left out."""

import json

from experiments import ablation_table


def _write(root, name, p1, p8, step=1.0):
    d = root / name
    d.mkdir()
    r = {"grpo": {"pass@1": p1, "pass@8": p8}, "median_step_s_this_process": step}
    (d / "results.json").write_text(json.dumps(r))


def test_table_paired_differences(tmp_path):
    _write(tmp_path, "baseline_s0", 0.30, 0.50)
    _write(tmp_path, "baseline_s1", 0.20, 0.40)
    _write(tmp_path, "replay_s0", 0.40, 0.45, step=2.0)
    _write(tmp_path, "replay_s1", 0.10, 0.40, step=4.0)
    (tmp_path / "replay_s2").mkdir()  # unfinished: no results.json
    (tmp_path / "replay_s2.log").write_text("")
    runs = ablation_table.load(str(tmp_path))
    assert sorted(runs) == ["baseline", "replay"] and sorted(runs["replay"]) == [0, 1]
    rows = ablation_table.table(runs, "baseline").splitlines()
    assert rows[2].startswith("| baseline | 0.300 | 0.200 | 0.250 |")
    # replay: mean 0.25; paired Δ = (+0.10 − 0.10)/2 = 0.000; 1 of 2 seeds better; pass@8 Δ = (−0.05 + 0)/2
    assert rows[3] == "| replay | 0.400 | 0.100 | 0.250 | +0.000 | 1/2 | 0.425 | -0.025 | 3.00 |"
