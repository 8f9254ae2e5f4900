"""The records and figures of a policy evaluation: per-sample rows (human-eval format plus the program, the
grade and, with several turns, the later turns), per-task rows (n, c, pass@k, the greedy result), pass@k with
95 % bootstrap intervals over tasks and Wilson intervals for greedy pass@1, per-turn summaries, and the
output directory written atomically (nothing on an error). The main job's evaluations write the same
per-task and greedy rows per step (write_step_records: WORKDIR/eval/step_<N>/<set>_per_task.jsonl and
<set>_greedy.jsonl); task_changes compares two per-task files (grpo_jax.eval.changes is its command line)."""

from __future__ import annotations

import json
import os
from typing import Any

from grpo_jax import atomic
from grpo_jax.codegen import pipeline
from grpo_jax.codegen.passk import pass_at_k

FILES = ("results.json", "per_task.jsonl", "samples.jsonl", "greedy.jsonl")


def grading_class(problem) -> str:
    """ "parent": every test is parent-graded; "parent+child": some asserts could not be split and run in the
    child check (the two-process checker); "child": only a child check."""
    if problem.child_check is None:
        return "parent"
    return "parent+child" if problem.tests else "child"


def sample_record(tid, problem, reply: str, verdict, j: int, fmt, later=None, turns: bool = False) -> dict:
    """One sample's row: the task id as its file wrote it, the graded completion and program, the grade, the
    sample index `j` and the model's reply; with several turns, its later turns (the feedback the model saw,
    its reply and that reply's grade)."""
    completion = pipeline.completion_for(problem, reply, fmt)
    row = {
        "task_id": tid,
        "completion": completion,
        "program": problem.program_for(completion),
        "passed": bool(verdict.passed),
        "status": verdict.status.value,
        "sample": j,
        "reply": reply,
        "tests_passed": verdict.tests_passed,
        "tests_total": len(problem.tests),
    }
    if turns:
        row["later_turns"] = later
    return row


def task_records(problems, task_ids, details: dict, n: int, ks, fmt, turns: bool = False):
    """(greedy rows, sample rows, per-task rows) of an evaluation's `details` (eval.evaluation.evaluate)."""
    g_texts, g_verdicts = details["greedy"]
    s_texts, s_verdicts = details.get("sampled", ([], []))
    g_later = details.get("greedy_later") or [None] * len(g_texts)
    s_later = details.get("sampled_later") or [None] * len(s_texts)
    greedy = [
        sample_record(tid, p, t, v, 0, fmt, lt, turns)
        for tid, p, t, v, lt in zip(task_ids, problems, g_texts, g_verdicts, g_later, strict=True)
    ]
    sampled = [
        sample_record(task_ids[i // n], problems[i // n], t, v, i % n, fmt, lt, turns)
        for i, (t, v, lt) in enumerate(zip(s_texts, s_verdicts, s_later, strict=True))
    ]
    per_task = []
    for i, (tid, p) in enumerate(zip(task_ids, problems, strict=True)):
        c = sum(r["passed"] for r in sampled[i * n : (i + 1) * n])
        row = {"task_id": tid, "n": n, "c": c}
        row.update({f"pass@{k}": pass_at_k(n, c, k) for k in ks})
        row.update(greedy_passed=greedy[i]["passed"], greedy_status=greedy[i]["status"])
        row["grading"] = grading_class(p)
        per_task.append(row)
    return greedy, sampled, per_task


def summarize_tasks(counts, greedy, ks, seed: int = 0) -> dict:
    """The benchmark figures from per-task results: counts [(n, c)] (sampled), greedy [passed], ks.

    {"pass@k": mean over tasks of passk.pass_at_k(n, c, k), "pass@k/ci95": [low, high] (percentile bootstrap
    over tasks, stats.bootstrap_ci with `seed`), "greedy/pass@1" with its bootstrap "ci95" and Wilson
    "wilson95" interval}."""
    from grpo_jax.stats import bootstrap_ci, wilson_interval

    out: dict[str, Any] = {}
    for k in ks:
        e = bootstrap_ci([pass_at_k(n, c, k) for n, c in counts], seed=seed)
        out[f"pass@{k}"], out[f"pass@{k}/ci95"] = e.value, [e.low, e.high]
    g = [1.0 if x else 0.0 for x in greedy]
    e, w = bootstrap_ci(g, seed=seed), wilson_interval(int(sum(g)), len(g))
    out["greedy/pass@1"], out["greedy/pass@1/ci95"] = e.value, [e.low, e.high]
    out["greedy/pass@1/wilson95"] = [w.low, w.high]
    return out


def turn_summaries(details: dict, n: int, ks, max_turns: int, seed: int = 0) -> dict:
    """{"turn{t}": summarize_tasks after turn t, t = 1..max_turns, "fix_rate": {greedy, sampled}}: a task's
    sample counts as passed after turn t if one of its first t turns passed (the turn numbers come from
    `pipeline.evaluate(..., turns=...)` in details["greedy_turn"] / details["sampled_turn"]). The fix rate: of
    the samples that failed turn 1, the fraction a later turn passed."""
    import numpy as np

    from grpo_jax.codegen.pipeline import fix_rate

    g = np.asarray(details["greedy_turn"])
    s = (
        np.asarray(details.get("sampled_turn", np.zeros(0, int))).reshape(-1, n)
        if n
        else np.zeros((len(g), 0))
    )
    out = {}
    for t in range(1, max_turns + 1):
        ok = (s >= 1) & (s <= t)
        counts = [(n, int(c)) for c in ok.sum(1)] if n else [(0, 0)] * len(g)
        out[f"turn{t}"] = summarize_tasks(counts, list((g >= 1) & (g <= t)), ks if n else (), seed=seed)

    out["fix_rate"] = {"greedy": fix_rate(g), "sampled": fix_rate(s.reshape(-1)) if n else None}
    return out


def write_dir_atomic(out_dir: str, files: dict[str, str]) -> None:
    """Every file of `files` ({name: text}) in a temporary directory next to `out_dir`, renamed to it when
    complete (onto a missing or empty directory: check_out_dir): on any error nothing is left."""
    atomic.write_dir(out_dir, files)


def jsonl(rows) -> str:
    """Rows as JSON lines (one object a line, each ending in a newline)."""
    return "".join(json.dumps(r) + "\n" for r in rows)


def written_task_ids(name: str, problems) -> list:
    """The task ids of the main job's evaluation set `name` as experiments.evaluate writes them, so that
    their per-task rows can be joined: the extra sets mbpp and humaneval by their files' own ids (MBPP's 11,
    not the loader's "Mbpp/11"; grpo_jax.eval.inputs.raw_task_ids), any other set by its problems' ids (the
    held-out set, as `experiments.evaluate --problems=heldout` writes it)."""
    from grpo_jax.codegen import datasets
    from grpo_jax.eval.inputs import raw_task_ids

    files = {"mbpp": lambda: datasets.MBPP_PATH, "humaneval": datasets.humaneval_path}
    if name not in files:
        return [p.task_id for p in problems]
    return raw_task_ids(problems, datasets.read_jsonl(files[name]()))


def step_records_dir(workdir: str, step: int) -> str:
    """Where the main job writes the per-task rows of its evaluation after `step` RL steps."""
    return os.path.join(workdir, "eval", f"step_{step}")


def write_step_records(workdir: str, step: int, name: str, problems, details: dict, spec, fmt) -> list[dict]:
    """The main job's records of evaluation set `name` after `step` RL steps: its per-task rows
    (task_records; the schema of experiments.evaluate's per_task.jsonl, ids by written_task_ids) to
    step_records_dir(workdir, step)/<name>_per_task.jsonl and its greedy rows to <name>_greedy.jsonl, each
    written atomically over any earlier copy (a resumed or extended run evaluating the same step replaces
    them). `details`: what eval.evaluation.evaluate filled; `spec`: its EvalSpec (samples, ks, turns).
    Returns the per-task rows."""
    ids, directory = written_task_ids(name, problems), step_records_dir(workdir, step)
    turns = spec.max_turns > 1
    greedy, _, per_task = task_records(problems, ids, details, spec.n_samples, spec.ks, fmt, turns=turns)
    atomic.write_text(os.path.join(directory, f"{name}_per_task.jsonl"), jsonl(per_task))
    atomic.write_text(os.path.join(directory, f"{name}_greedy.jsonl"), jsonl(greedy))
    return per_task


def task_changes(before_rows, after_rows, key: str = "greedy_passed") -> dict[str, Any]:
    """Which tasks changed between two per-task files' rows (e.g. the main job's step 0, after SFT, and its
    last step, after GRPO): {"gained": task ids passed after and not before, "lost": passed before and not
    after (both in `before_rows`' order), "both": how many passed in both, "neither": how many in neither}.
    A task passed where row[key] is true (greedy_passed; a count such as c or a pass@k above 0 reads as
    passed). ValueError when a file repeats a task id, a row lacks `key`, or the two hold different tasks."""

    def passed(rows, which: str) -> dict:
        out: dict = {}
        for i, r in enumerate(rows):
            tid = r["task_id"]
            if key not in r:
                raise ValueError(f"{which}: row {i + 1} (task {tid!r}) has no {key!r}")
            if tid in out:
                raise ValueError(f"{which}: task {tid!r} appears twice")
            out[tid] = bool(r[key])
        return out

    before, after = passed(before_rows, "before"), passed(after_rows, "after")
    if before.keys() != after.keys():
        only_b, only_a = before.keys() - after.keys(), after.keys() - before.keys()
        raise ValueError(
            f"the two hold different tasks ({len(only_b)} only before, e.g. {sorted(map(str, only_b))[:3]}; "
            f"{len(only_a)} only after, e.g. {sorted(map(str, only_a))[:3]})"
        )
    return {
        "gained": [t for t, ok in before.items() if not ok and after[t]],
        "lost": [t for t, ok in before.items() if ok and not after[t]],
        "both": sum(ok and after[t] for t, ok in before.items()),
        "neither": sum(not ok and not after[t] for t, ok in before.items()),
    }
