"""The main job's phases called one by one (grpo_jax.train.loop: setup, warm_start, rl_step, evaluate,
finish), each checked for what it hands to the next: the state's step, the checkpoints on disk, the logged
lines, the per-problem counts, the results. The whole run through `loop.run` is tests/test_codegen_e2e.py."""

import json
import re

import jax
import mainjob
import numpy as np
import pytest

from grpo_jax.eval import evaluation
from grpo_jax.eval.progress import EvalProgress
from grpo_jax.runtime import compile_cache
from grpo_jax.train import heldout, loop
from grpo_jax.train.console import Progress
from grpo_jax.train.export import params_digest

FLAGS = (mainjob.TINY, "--steps=2", "--checkpoint_every=0", "--eval_samples=0", "--eval_ks=")


@pytest.fixture(scope="module")
def ex():
    with mainjob.executor() as e:
        yield e


def test_phases_hand_over_state_checkpoints_logs_and_results(tmp_path, ex, monkeypatch):
    wd = tmp_path / "run"
    cfg, notes = mainjob.config(*FLAGS, workdir=wd)
    lines: list[str] = []
    run, state, step = loop.setup(cfg, ex, lines.append, notes)
    try:
        assert state is None and step == 0  # a fresh workdir: nothing to restore
        assert json.loads((wd / "run.json").read_text())["config"]["steps"] == 2

        state = loop.warm_start(run)
        assert int(state.train.step) == 0 and run.ckpt.latest_step() == 0  # checkpoint 0 is on disk
        assert "sft" not in run.results and not any("[eval" in x for x in lines)  # saved before evaluating
        run.results["sft"] = loop.evaluate(run, state, 0, "after SFT")  # as loop.run does next
        assert 0.0 <= run.results["sft"]["pass@1"] <= 1.0 and any("[eval after SFT]" in x for x in lines)
        before = params_digest(jax.device_get(state.train.params))

        progress = Progress(cfg.steps, start_step=0, print_fn=run.print)
        state = loop.rl_step(run, state, 0, progress)
        assert int(state.train.step) == 1
        assert params_digest(jax.device_get(state.train.params)) != before  # the update moved the policy
        stats = jax.device_get(state.rollout.stats)  # every sampled completion is counted once
        assert int(np.sum(stats.attempts)) == cfg.rollout.prompts_per_step * cfg.rollout.group_size
        assert run.ckpt.latest_step() == 0  # rl_step itself never saves
        logged = mainjob.metrics(wd)
        assert sorted(logged) == [1] and 0.0 <= logged[1]["reward"] <= 1.0

        engine = run.rollout.engine  # the training rollout's engine and its compiled sampler
        assert engine.cache_size() == 1
        monkeypatch.setattr(compile_cache, "directory", lambda: str(tmp_path))  # a persistent cache is on
        ev = loop.evaluate(run, state, 1, "phase test")
        assert engine.cache_size() == 0  # dropped before the evaluation (evaluation.release_all)
        monkeypatch.undo()
        assert 0.0 <= ev["pass@1"] <= 1.0 and ev["seconds"] > 0
        assert any("[eval phase test]" in x for x in lines)
        # a long evaluation (here: every one, quiet_s=0) shows a progress line per batch with an ETA
        monkeypatch.setattr(heldout, "EvalProgress", lambda n, write, quiet_s: EvalProgress(n, write))
        del lines[:]
        loop.evaluate(run, state, 2, "phase test")  # (another step: step 1's would be reused)
        n = -(-len(run.problems.heldout) // cfg.eval.batch)
        shown = [re.sub(r"[0-9.]+ s, ETA \d+ s$", "T", x) for x in lines if "batches" in x]
        assert shown == [
            f"[eval phase test] heldout [sampling greedy] {i}/{n} batches, T" for i in range(1, n + 1)
        ]
        monkeypatch.undo()
        # the evaluation's compiled samplers: kept without a persistent compilation cache, dropped (freed)
        # when the cache can give them back (evaluation.release_engine)
        monkeypatch.setattr(compile_cache, "directory", lambda: None)
        loop.evaluate(run, state, 3, "phase test")
        assert run.eval_engine.cache_size() == 1  # one held-out shape
        monkeypatch.setattr(compile_cache, "directory", lambda: str(tmp_path))
        evaluation.release_engine(run.eval_engine)
        assert run.eval_engine.cache_size() == 0
        # within an evaluation, a new prompt-length bucket drops the last one's executable (cache on only)
        policy = evaluation.Policy(state.train.params, run.tok, cfg.tasks.prompt, run.ctx.host)
        spec = evaluation.spec_from_config(cfg, run.eval_engine)
        for cache_dir, kept in ((None, 2), (str(tmp_path), 1)):
            monkeypatch.setattr(compile_cache, "directory", lambda d=cache_dir: d)
            evaluation.release_engine(run.eval_engine)
            run.eval_engine.release()
            fn = evaluation.sample_fn(policy, run.eval_engine, jax.random.PRNGKey(0), spec)
            for width in (8, 12):
                fn(np.full((2, width), 5, np.int32), np.ones((2, width), np.int32), 1, True)
            assert run.eval_engine.cache_size() == kept
        monkeypatch.undo()

        results = loop.finish(run, state, 1)
        final = params_digest(jax.device_get(state.train.params))
        assert results["steps"] == 1 and results["final_params_sha256"] == final
        assert results["grpo_eval_step"] == 1 and run.ckpt.latest_step() == 1  # finish saves its step
        assert json.loads((wd / "results.json").read_text())["final_params_sha256"] == final
        assert results["train_problems"]["n_problems_seen"] >= 1
    finally:
        run.close()

    # the same workdir again: setup restores finish's checkpoint, and train runs the remaining step only
    run, state, step = loop.setup(cfg, ex, lines.append, notes)
    try:
        assert step == 1 and params_digest(jax.device_get(state.train.params)) == final
        state, step, interrupted = loop.train(run, state, step)
        assert (step, interrupted, int(state.train.step)) == (2, False, 2)
        assert sorted(mainjob.metrics(wd)) == [1, 2]  # step 1 kept, step 2 appended
    finally:
        run.close()


def test_eval_progress_is_quiet_for_short_evaluations_and_counts_every_batch():
    calls = []
    fn = lambda prompt, pmask, n, greedy: (prompt, n)  # noqa: E731
    loud = EvalProgress(3, calls.append)
    quiet = EvalProgress(3, calls.append, quiet_s=3600.0)
    for p in (loud, quiet):
        wrapped = p.sampler(fn)
        for i in range(3):
            assert wrapped(i, None, 8, False) == (i, 8)
        wrapped(0, None, 1, True)
    shown = [re.sub(r"[0-9.]+ s, ETA \d+ s$", "T", x) for x in calls]
    assert shown == [f"[sampling 8 samples/task] {i}/3 batches, T" for i in (1, 2, 3)] + [
        "[sampling greedy] 1/3 batches, T"
    ]
    assert quiet.seconds["sampling"] >= 0.0 and quiet.done == 1 and quiet.what == "greedy"
