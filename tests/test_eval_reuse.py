"""An evaluation is computed once per identity (grpo_jax.train.heldout): the parameters, the eval key and
step, the evaluation settings, the engine, model, tokenizer, prompt format, sandbox limits and the problems.
The same identity on disk (this workdir, or --sft_from's at step 0) is reused with its per-task rows; anything
else is computed anew. Checkpoint 0 is written before the step-0 evaluation, so a run stopped during that
evaluation resumes after SFT."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import mainjob
import pytest

from grpo_jax.eval import evaluation
from grpo_jax.train import heldout, loop

GREEDY = ("--eval_samples=0", "--eval_ks=")


@pytest.fixture(scope="module")
def ex():
    with mainjob.executor() as e:
        yield e


def _counting(monkeypatch) -> list:
    """Count the evaluations actually computed (one call of evaluation.evaluate per set)."""
    calls: list = []
    real = evaluation.evaluate

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(evaluation, "evaluate", counted)
    return calls


def test_identity_names_everything_the_figures_depend_on(tmp_path, ex):
    cfg, notes = mainjob.config(mainjob.TINY, "--steps=0", *GREEDY, workdir=tmp_path / "w")
    run, _, _ = loop.setup(cfg, ex, lambda _: None, notes)
    try:
        state = loop.warm_start(run)
        params, key = state.train.params, state.train.rng["eval"]
        spec = evaluation.spec_from_config(cfg, run.eval_engine)
        base = heldout.identity(run, params, key, 0, spec)
        assert heldout.identity(run, params, key, 0, spec) == base  # a function of its inputs
        leaves = jax.tree.leaves(params)
        nudged = jax.tree.unflatten(jax.tree.structure(params), [leaves[0] + 1e-6, *leaves[1:]])
        changed = {
            "params_sha256": heldout.identity(run, nudged, key, 0, spec),
            "eval_key": heldout.identity(run, params, jnp.asarray(key) + 1, 0, spec),
            "step": heldout.identity(run, params, key, 1, spec),
            "spec": heldout.identity(run, params, key, 0, dataclasses.replace(spec, temperature=0.5)),
        }
        for field, ident in changed.items():
            assert [k for k in base if base[k] != ident[k]] == [field]
        run.problems = run.problems._replace(heldout=run.problems.heldout[:-1])
        assert [k for k, v in heldout.identity(run, params, key, 0, spec).items() if v != base[k]] == ["sets"]
    finally:
        run.close()


def test_a_steps0_run_evaluates_once_and_a_stale_summary_is_not_reused(tmp_path, ex, monkeypatch):
    calls = _counting(monkeypatch)
    wd = tmp_path / "w"
    res, out = mainjob.run(mainjob.TINY, "--steps=0", *GREEDY, workdir=wd, executor=ex)
    assert len(calls) == 1  # the final evaluation (step 0 again) is the step-0 one, reused
    assert (
        "[eval after GRPO] reused: the same evaluation (parameters, key, settings, tasks) in this workdir"
        in out
    )
    same = lambda ev: {k: v for k, v in ev.items() if k != "seconds"}  # noqa: E731
    assert same(res["grpo"]) == same(res["sft"]) and res["evals_reused"] == {"0": str(wd)}
    summary = json.loads((wd / "eval" / "step_0" / heldout.SUMMARY).read_text())
    assert summary["results"] == res["sft"] and summary["identity"]["step"] == 0

    # the same workdir evaluated by another run (here: the summary's parameters differ): computed anew
    summary["identity"]["params_sha256"] = "0" * 64
    (wd / "eval" / "step_0" / heldout.SUMMARY).write_text(json.dumps(summary))
    (wd / "results.json").unlink()
    cfg, notes = mainjob.config(mainjob.TINY, "--steps=0", *GREEDY, workdir=wd)
    run, state, step = loop.setup(cfg, ex, lambda _: None, notes)
    try:
        assert step == 0
        again = loop.evaluate(run, state, 0, "again")
    finally:
        run.close()
    assert len(calls) == 2 and same(again) == same(res["sft"])  # deterministic: the same figures
    fresh = json.loads((wd / "eval" / "step_0" / heldout.SUMMARY).read_text())
    assert fresh["identity"]["params_sha256"] != "0" * 64


def test_an_arm_reuses_its_warm_starts_step0_evaluation_and_not_another_one(tmp_path, ex, monkeypatch):
    calls = _counting(monkeypatch)
    warm, arm, other = tmp_path / "warm", tmp_path / "arm", tmp_path / "other"
    w, _ = mainjob.run(mainjob.TINY, "--steps=0", *GREEDY, workdir=warm, executor=ex)
    assert len(calls) == 1
    a, out = mainjob.run(mainjob.TINY, "--steps=1", *GREEDY, f"--sft_from={warm}", workdir=arm, executor=ex)
    assert len(calls) == 2  # the final one only
    assert f"[eval after SFT] reused: the same evaluation (parameters, key, settings, tasks) in {warm}" in out
    assert a["sft"] == w["sft"] and a["evals_reused"] == {"0": str(warm)}
    for name in ("heldout_per_task.jsonl", "heldout_greedy.jsonl", heldout.SUMMARY):  # the rows came along
        assert (arm / "eval" / "step_0" / name).read_bytes() == (warm / "eval" / "step_0" / name).read_bytes()
    # another evaluation of the same parameters (2 samples per task): computed
    o, out = mainjob.run(
        mainjob.TINY,
        "--steps=1",
        "--eval_samples=2",
        "--eval_ks=1,2",
        f"--sft_from={warm}",
        workdir=other,
        executor=ex,
    )
    assert len(calls) == 4 and "reused" not in out and "evals_reused" not in o
    assert o["sft"]["pass@1"] == w["sft"]["pass@1"]  # greedy pass@1 of the same parameters


def test_a_run_stopped_during_its_step0_evaluation_resumes_after_sft(tmp_path, ex, monkeypatch):
    wd = tmp_path / "w"
    cfg, notes = mainjob.config(mainjob.TINY, "--steps=1", *GREEDY, workdir=wd)

    def stopped(*a, **kw):
        raise KeyboardInterrupt("stopped during the evaluation")

    monkeypatch.setattr(evaluation, "evaluate", stopped)
    with pytest.raises(KeyboardInterrupt):
        loop.run(cfg, ex, print_fn=lambda _: None, notes=notes)
    monkeypatch.undo()
    assert (wd / "checkpoints" / "0").is_dir() and not (wd / "eval" / "step_0" / heldout.SUMMARY).exists()
    res, out = mainjob.run(mainjob.TINY, "--steps=1", *GREEDY, workdir=wd, executor=ex)
    assert "resumed from" in out and "sft step" not in out  # SFT not repeated
    assert "[eval after SFT]" in out and 0.0 <= res["sft"]["pass@1"] <= 1.0 and res["steps"] == 1


@pytest.mark.parametrize("turns", [(), ("--max_turns=2", "--feedback_tokens=96")], ids=["1turn", "2turns"])
def test_an_evaluation_stopped_part_way_samples_only_what_it_had_not(tmp_path, ex, monkeypatch, turns):
    """Sampler calls (and with execution feedback their later turns) kept in .partial/ until the summary:
    the second attempt reads back the calls the first made and draws the rest; its figures and rows equal an
    uninterrupted evaluation's."""
    args = (mainjob.TINY, "--steps=0", "--eval_batch=1", *turns)  # 4 held-out tasks: 4 greedy + 4 sampled
    clean, _ = mainjob.run(*args, workdir=tmp_path / "clean", executor=ex)
    drawn: list = []  # the calls sampled (each is written to the store once drawn)
    later: list = []  # the calls whose later turns were run (each written once run)
    real_put, real_put_turns = evaluation.SampleStore.put, evaluation.SampleStore.put_turns

    def put(self, i, tokens, mask):
        real_put(self, i, tokens, mask)
        drawn.append(i)
        if stop and len(drawn) == 6:
            raise KeyboardInterrupt("stopped during the sampled pass")

    def put_turns(self, i, passed_turn, turn_texts):
        real_put_turns(self, i, passed_turn, turn_texts)
        later.append(i)

    stop = True
    monkeypatch.setattr(evaluation.SampleStore, "put", put)
    monkeypatch.setattr(evaluation.SampleStore, "put_turns", put_turns)
    wd = tmp_path / "w"
    cfg, notes = mainjob.config(*args, workdir=wd)
    with pytest.raises(KeyboardInterrupt):
        loop.run(cfg, ex, print_fn=lambda _: None, notes=notes)
    kept = sorted(p.name for p in (wd / "eval" / "step_0" / heldout.PARTIAL).glob("*/heldout/*.npz"))
    assert kept == [f"{i}.npz" for i in range(1, 7)] and drawn == [1, 2, 3, 4, 5, 6]
    assert later == ([1, 2, 3, 4, 5] if turns else [])  # call 6 stopped before its later turns
    stop = False
    res, out = mainjob.run(*args, workdir=wd, executor=ex)
    assert drawn[6:] == [7, 8]  # only the calls the first attempt had not made
    assert later[5:] == ([6, 7, 8] if turns else [])  # and only the later turns it had not run
    assert "[eval after SFT] heldout: 6 sampler batches read back from an earlier attempt" in out
    same = lambda ev: {k: v for k, v in ev.items() if k != "seconds"}  # noqa: E731
    assert same(res["sft"]) == same(clean["sft"])
    if turns:
        assert "turn2/pass@1" in res["sft"] and "fix_rate" in res["sft"]
    for name in ("heldout_per_task.jsonl", "heldout_greedy.jsonl"):
        got, want = (d / "eval" / "step_0" / name for d in (wd, tmp_path / "clean"))
        assert got.read_text() == want.read_text()
    assert not (wd / "eval" / "step_0" / heldout.PARTIAL).exists()


def test_problem_digests_take_any_test_data_and_agree_across_processes():
    """Call-based tests carry dicts with tuple keys and sets (the CodeI/O set crashed a JSON digest): the
    digest takes them, tells them apart, and is the same in a process with another string-hash seed."""
    import os
    import subprocess
    import sys

    from grpo_jax.problem import Problem, TestCase

    code = (
        "from grpo_jax.problem import Problem, TestCase\n"
        "from grpo_jax.train.heldout import _sha\n"
        "t = TestCase(call='f()', expected={(1, 'a'): {'x', 'y', 'z'}, 'k': [1.5, None]})\n"
        "print(_sha([Problem('t', 'p', 'f', 'r', tests=(t,))]))\n"
    )
    t = TestCase(call="f()", expected={(1, "a"): {"x", "y", "z"}, "k": [1.5, None]})
    here = heldout._sha([Problem("t", "p", "f", "r", tests=(t,))])
    other = TestCase(call="f()", expected={(1, "a"): {"x", "y"}, "k": [1.5, None]})
    assert heldout._sha([Problem("t", "p", "f", "r", tests=(other,))]) != here
    assert heldout._sha({"a": (1, 2)}) != heldout._sha({"a": [1, 2]})
    seeds = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        seeds.append(out.stdout.strip())
    assert seeds == [here, here]
