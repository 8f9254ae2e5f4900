"""The main job's evaluations write per-task rows: after `step` RL steps, WORKDIR/eval/step_<step>/ holds
<set>_per_task.jsonl (experiments.evaluate's per_task.jsonl schema) and <set>_greedy.jsonl (the greedy
replies) of the held-out set and of each extra set, written atomically over any earlier copy. One tiny run
in-process (tests/mainjob.py) writes them for step 0 (after SFT) and its last step (after GRPO); they agree
with the figures of results.json and are experiments.evaluate's rows of the same checkpoint;
grpo_jax.eval.results.task_changes (and its command line, grpo_jax.eval.changes) lists the tasks gained and
lost between two such files."""

from __future__ import annotations

import json

import mainjob
import pytest

from grpo_jax.codegen import datasets, pipeline
from grpo_jax.eval import changes as changes_cli
from grpo_jax.eval.results import task_changes

STEPS = 2
PER_TASK_KEYS = {"task_id", "n", "c", "pass@1", "pass@2", "greedy_passed", "greedy_status", "grading"}


def rows(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


HELD = [f"synthetic/L0/heldout/{i}" for i in range(4)]  # the tiny run's held-out split
# the held-out replies made right (the reference) at each evaluation, so that the rows are not all failures
# (the tiny model solves nothing): {evaluation: (greedy: task indices, sampled: {task index: sample indices})}
RIGHT = {0: ({0, 1}, {0: {0}, 3: {0, 1}}), 1: ({1, 2}, {1: {1}})}


def with_right_replies(real, first: int = 0):
    """pipeline._batched_samples with the replies of RIGHT replaced by the problems' references (in the
    evaluation's order from RIGHT[first]: the held-out set's greedy and sampled passes at step 0, then at the
    last step)."""
    greedy_calls: list[int] = [1] * first

    def batched(sample_fn, tok, problems, plan, n, greedy, fmt, turns=None):
        texts, turn, later = real(sample_fn, tok, problems, plan, n, greedy, fmt, turns)
        if [p.task_id for p in problems] != HELD:
            return texts, turn, later
        if greedy:
            greedy_calls.append(1)
        right_greedy, right_sampled = RIGHT[len(greedy_calls) - 1]
        for i, p in enumerate(problems):
            for j in range(n):
                if (greedy and i in right_greedy) or (not greedy and j in right_sampled.get(i, ())):
                    texts[i * n + j] = pipeline.sft_target(p, fmt)
        return texts, turn, later

    return batched


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, results.json) of a tiny run (held-out set + the first 2 MBPP test tasks, greedy) whose
    held-out replies are right as RIGHT says and whose workdir held a stale step-0 per-task file."""
    wd = tmp_path_factory.mktemp("per_task") / "run"
    stale = wd / "eval" / "step_0" / "heldout_per_task.jsonl"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"task_id": "stale", "greedy_passed": True}) + "\n")
    with pytest.MonkeyPatch.context() as mp, mainjob.executor() as ex:
        mp.setattr(pipeline, "_batched_samples", with_right_replies(pipeline._batched_samples))
        mainjob.run(mainjob.TINY, f"--steps={STEPS}", "--eval_mbpp=2", workdir=wd, executor=ex)
    return wd, json.loads((wd / "results.json").read_text())


@pytest.mark.parametrize("step, phase, evaluation", [(0, "sft", 0), (STEPS, "grpo", 1)])
def test_each_evaluation_writes_per_task_rows_that_agree_with_its_figures(run, step, phase, evaluation):
    wd, results = run
    figures = results[phase]
    d = wd / "eval" / f"step_{step}"
    assert sorted(p.name for p in d.iterdir()) == [
        "heldout_greedy.jsonl",
        "heldout_per_task.jsonl",
        "mbpp_greedy.jsonl",
        "mbpp_per_task.jsonl",
        "summary.json",  # the evaluation's identity and figures (grpo_jax.train.heldout), written last
    ]
    held = rows(d / "heldout_per_task.jsonl")
    # the procedural held-out split (4 tasks of level 0), each once: the stale row was replaced, not kept
    assert [r["task_id"] for r in held] == HELD
    assert all(set(r) == PER_TASK_KEYS and r["n"] == 2 and r["grading"] == "parent" for r in held)
    right_greedy, right_sampled = RIGHT[evaluation]
    assert [r["greedy_passed"] for r in held] == [i in right_greedy for i in range(4)]
    assert [r["c"] for r in held] == [len(right_sampled.get(i, ())) for i in range(4)]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean([r["greedy_passed"] for r in held]) == figures["pass@1"]  # greedy pass@1
    assert mean([r["pass@2"] for r in held]) == pytest.approx(figures["pass@2"])
    assert mean([r["pass@1"] for r in held]) == pytest.approx(figures["pass@1/sampled"])
    greedy = rows(d / "heldout_greedy.jsonl")
    assert [(g["task_id"], g["passed"], g["status"], g["sample"]) for g in greedy] == [
        (r["task_id"], r["greedy_passed"], r["greedy_status"], 0) for r in held
    ]
    assert all(isinstance(g["reply"], str) and g["program"] for g in greedy)
    # an extra set, greedy only, by the ids its file writes (experiments.evaluate --problems=mbpp's)
    mbpp = rows(d / "mbpp_per_task.jsonl")
    assert [r["task_id"] for r in mbpp] == [
        r["task_id"] for r in datasets.read_jsonl(datasets.MBPP_PATH) if 11 <= r["task_id"] <= 510
    ][:2]
    assert all(set(r) == PER_TASK_KEYS - {"pass@1", "pass@2"} and r["n"] == 0 for r in mbpp)
    assert mean([r["greedy_passed"] for r in mbpp]) == figures["mbpp/pass@1"]
    assert len(rows(d / "mbpp_greedy.jsonl")) == 2


def test_no_other_step_was_written(run):
    wd, _ = run
    assert sorted(p.name for p in (wd / "eval").iterdir()) == ["step_0", f"step_{STEPS}"]


def test_task_changes_lists_the_tasks_gained_and_lost():
    before = [
        {"task_id": "a", "greedy_passed": False},
        {"task_id": "b", "greedy_passed": True},
        {"task_id": 7, "greedy_passed": True},
        {"task_id": "d", "greedy_passed": False},
        {"task_id": "e", "greedy_passed": False},
    ]
    after = [  # another order: matched by task id
        {"task_id": "e", "greedy_passed": True},
        {"task_id": "d", "greedy_passed": False},
        {"task_id": 7, "greedy_passed": True},
        {"task_id": "b", "greedy_passed": False},
        {"task_id": "a", "greedy_passed": True},
    ]
    assert task_changes(before, after) == {"gained": ["a", "e"], "lost": ["b"], "both": 1, "neither": 1}
    assert task_changes(after, before) == {"gained": ["b"], "lost": ["e", "a"], "both": 1, "neither": 1}
    counts = [{"task_id": "a", "c": 0}, {"task_id": "b", "c": 3}]
    assert task_changes(counts, [{"task_id": "a", "c": 1}, {"task_id": "b", "c": 0}], key="c") == {
        "gained": ["a"],
        "lost": ["b"],
        "both": 0,
        "neither": 0,
    }
    with pytest.raises(ValueError, match="different tasks"):
        task_changes(before, after[:4])
    with pytest.raises(ValueError, match="appears twice"):
        task_changes(before + before[:1], after)
    with pytest.raises(ValueError, match="has no 'c'"):
        task_changes(before, after, key="c")


def test_the_changes_command_compares_two_steps_of_a_run(run, capsys):
    wd, _ = run
    before, after = (wd / "eval" / f"step_{s}" / "heldout_per_task.jsonl" for s in (0, STEPS))
    # after SFT tasks 0 and 1 passed greedily, after GRPO 1 and 2 (RIGHT)
    expected = {"gained": [HELD[2]], "lost": [HELD[0]], "both": 1, "neither": 1}
    assert task_changes(rows(before), rows(after)) == expected
    assert changes_cli.main([str(before), str(after), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    assert changes_cli.main([str(before), str(after)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"gained (1): {HELD[2]}",
        f"lost (1): {HELD[0]}",
        "both 1, neither 1 (4 tasks, by greedy_passed)",
    ]
    assert changes_cli.main([str(before), str(wd / "missing.jsonl")]) == 2
    assert "error: " in capsys.readouterr().err


def test_the_rows_are_experiments_evaluate_s_rows_of_the_same_checkpoint(run, tmp_path):
    """experiments.evaluate --checkpoint=WORKDIR:STEP --problems=heldout samples what the main job's
    evaluation at that step sampled (its evaluation key): its per_task.jsonl and greedy.jsonl are the main
    job's files, row for row."""
    from experiments import evaluate as ev

    wd, _ = run
    out = tmp_path / "evaluated"
    ev.FLAGS.unparse_flags()
    try:
        ev.FLAGS(["evaluate", f"--checkpoint={wd}:{STEPS}", "--problems=heldout", f"--out_dir={out}"])
        o = ev.policy_eval_from_flags()
    finally:
        ev.FLAGS.unparse_flags()
    with pytest.MonkeyPatch.context() as mp, mainjob.executor() as ex:
        mp.setattr(pipeline, "_batched_samples", with_right_replies(pipeline._batched_samples, first=1))
        ev.evaluate_policy(o, ex, log=lambda _: None)
    mine = wd / "eval" / f"step_{STEPS}"
    assert rows(out / "per_task.jsonl") == rows(mine / "heldout_per_task.jsonl")
    assert rows(out / "greedy.jsonl") == rows(mine / "heldout_greedy.jsonl")
