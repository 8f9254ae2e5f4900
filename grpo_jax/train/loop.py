"""The code-generation run in phases: set-up / resume, warm start, RL steps, evaluation, finish.

    executor = Executor(...)                        # the sandbox, started by the caller
    results = run(cfg, executor)                    # cfg: grpo_jax.config.RunConfig

    setup(cfg, executor)      the Run (grpo_jax.train.build: tasks, tokenizer, model, optimizer, checkpointer,
                              rollout, train step) and the latest checkpoint when the workdir holds one
                              (grpo_jax.train.resume)
    warm_start(run)           model init, SFT, LoRA adapters over the frozen base, checkpoint 0, then the
                              evaluation at step 0 (in run(): a run resumed at step 0 evaluates there)
    train(run, state, step)   RL steps until cfg.steps (or a signal): checkpoints, periodic evaluation
      rl_step                 rollout.produce -> train_step -> rollout.settle -> log
    evaluate(run, state, step, tag)   held-out pass@1 greedy and pass@k sampled (the "eval" stream: the
                              training trajectory never depends on it; grpo_jax.train.heldout: an
                              evaluation of the same identity already on disk is reused)
    finish(run, state, step)  final evaluation, pass-rate table, results.json

Host loop only, no math (grpo_jax.core, grpo_jax.algorithms, grpo_jax.train.step). The step counter lives on
the host: it is read from the device once, when a checkpoint is restored. Resume: the RunState and host JSON
are checkpointed together; every random choice is a named key of (stream, step), so a run killed at any point
and restarted ends bit-identical to an uninterrupted one (tests/test_codegen_e2e.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import jax
import numpy as np

from grpo_jax import rng as rng_lib
from grpo_jax.codegen import pipeline
from grpo_jax.config import OptimConfig, RunConfig
from grpo_jax.policies import lora
from grpo_jax.policies import transformer as tfm
from grpo_jax.rollout import multiturn
from grpo_jax.runtime.memory import memory_metrics
from grpo_jax.sandbox.executor import Executor
from grpo_jax.train import sft
from grpo_jax.train.build import Run, RunConfigError, build, placed_state
from grpo_jax.train.checkpoint import SignalFlag
from grpo_jax.train.console import Progress, final_table
from grpo_jax.train.export import export, params_digest
from grpo_jax.train.heldout import evaluate
from grpo_jax.train.logging import MetricsLogger, NullLogger, write_json_atomic
from grpo_jax.train.pass_rates import PassRateTable
from grpo_jax.train.resume import check_sft_source, restore, save, sft_params_from
from grpo_jax.train.state import RunState, make_optimizer

__all__ = ["RunConfigError", "evaluate", "finish", "rl_step", "run", "setup", "sft_warm_start", "train"]

CONSOLE_KEYS: tuple[str, ...] = (
    "reward",
    "Performance/SuccessRate",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "grad_norm",
)
CONSOLE_KEYS += multiturn.CONSOLE_KEYS  # grpo_jax.rollout.multiturn


def run(cfg: RunConfig, executor: Executor, print_fn: Callable[[str], None] = print, notes=()) -> dict:
    """The whole run; returns the results dict (also written to workdir/results.json)."""
    job, state, step = setup(cfg, executor, print_fn, notes)  # job: this run's Run
    try:
        if state is None:
            state = warm_start(job)
        if step == 0 and "sft" not in job.results:  # checkpoint 0 is saved before its evaluation
            job.results["sft"] = evaluate(job, state, 0, "after SFT" if cfg.sft.steps else "before GRPO")
        state, step, interrupted = train(job, state, step)
        return job.results if interrupted else finish(job, state, step)
    finally:
        job.close()


def setup(cfg: RunConfig, executor: Executor, print_fn=print, notes=()) -> tuple[Run, RunState | None, int]:
    """(Run, restored state or None, its step): the run's host objects and the workdir's latest checkpoint."""
    run = build(cfg, executor, print_fn, notes)
    try:
        state, step = restore(run)
        if state is None and cfg.sft.from_workdir:
            check_sft_source(cfg)  # before anything is logged
    except BaseException:
        run.close()
        raise
    run_info = {"config": cfg.to_json(), "tokenizer": run.tok.fingerprint(), "notes": list(run.notes)}
    if state is not None:  # the checkpoint's weights replace the pretrained ones; record which it was
        run.pretrained = None
        run_info.update({k: run.results[k] for k in ("resumed_from_step", "skipped_corrupt_steps")})
    purge = None if state is None else step + 1
    run.logger = (
        MetricsLogger(cfg.workdir, run_info=run_info, purge_step=purge) if run.ctx.is_main else NullLogger()
    )
    return run, state, step


def warm_start(run: Run) -> RunState:
    """Model init and SFT on the reference solutions, the RL state over them, evaluation, checkpoint 0."""
    cfg, streams = run.cfg, rng_lib.streams(run.cfg.seed)
    if cfg.sft.from_workdir:  # another run's post-SFT parameters (equal SFT inputs: the same parameters)
        params = sft_params_from(run)
    else:
        if run.pretrained is not None:
            params, run.pretrained = run.pretrained, None
        else:
            params = tfm.init_params(run.model, rng_lib.derive(streams["init"], "model"))
        if cfg.sft.steps:
            params = sft_warm_start(run, params, streams["sft"])
    state = placed_state(run, params)
    del params  # the state holds its own copy: the loaded weights are not kept through the first evaluation
    run.rollout.bind(state.frozen)
    if cfg.lora.enabled:
        n_ad, n_all = lora.num_params(state.train.params), lora.num_params(state.frozen)
        run.print(f"LoRA rank {cfg.lora.rank}: training {n_ad} adapter parameters, base ({n_all}) frozen")
    if run.model.value_head:
        p = cfg.objective.ppo
        run.print(
            f"PPO: the critic is a value head on the policy's trunk ({run.model.d_model + 1} parameters: one "
            f"D -> 1 projection per token; γ {p.gamma}, λ {p.lam}, vf_coef {p.vf_coef})"
        )
    save(run, state, 0)  # before the evaluation: a run stopped during it resumes after SFT (run() evaluates)
    return state


def sft_warm_start(run: Run, params, key):
    """The supervised warm start on the SFT problems' reference solutions (the source's, or --sft_data's:
    run.problems.sft); their count, its time and final loss go to the results."""
    cfg, t = run.cfg, time.perf_counter()
    steps = cfg.sft.steps
    if steps is None:  # "auto" is resolved with the config, before any run starts
        raise ValueError("sft_warm_start: --sft_steps is unresolved (auto)")
    data = pipeline.sft_examples(
        run.tok, run.problems.sft, cfg.tasks.prompt_len, cfg.rollout.max_new_tokens, cfg.tasks.prompt
    )
    warmup = min(cfg.sft.warmup_steps, steps)
    sft_opt = make_optimizer(OptimConfig(learning_rate=cfg.sft.lr, warmup_steps=warmup))
    params, hist = sft.sft_train(
        params,
        run.model,
        sft_opt,
        data,
        steps=steps,
        batch_size=cfg.sft.batch,
        key=key,
        log_every=max(1, steps // 5),
        print_fn=run.print,
        bucket=cfg.sft.bucket,
    )
    run.results["sft_seconds"] = time.perf_counter() - t
    run.results["sft_final_loss"] = hist[-1]["loss"]
    run.results["sft_problems"] = len(run.problems.sft)
    return params


def train(run: Run, state: RunState, step: int) -> tuple[RunState, int, bool]:
    """RL steps from `step` until cfg.steps; (state, step, interrupted). A SIGTERM/SIGINT finishes the step,
    saves and stops."""
    cfg = run.cfg
    progress = Progress(cfg.steps, start_step=step, print_fn=run.print)
    stop = SignalFlag.install()
    try:
        while step < cfg.steps:
            run.ctx.barrier(f"step {step}")  # a hung process ends the run here (PeerLost)
            state = rl_step(run, state, step, progress)
            step += 1
            run.ctx.idle()  # evaluation and checkpoints below have no progress deadline
            if run.ctx.multi and any(run.ctx.allgather_objects("stop", stop.is_set())):
                stop.set()  # a signal to any process stops them all at the same step (saves are collective)
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.steps:
                run.results.setdefault("evals", {})[str(step)] = evaluate(run, state, step, f"step {step}")
            if stop.is_set() or (
                cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < cfg.steps
            ):
                save(run, state, step)
            if stop.is_set():
                run.print(f"signal received: checkpoint saved at step {step}; exiting")
                run.results["interrupted_at"] = step
                return state, step, True
    finally:
        stop.uninstall()
    return state, step, False


def rl_step(run: Run, state: RunState, step: int, progress: Progress) -> RunState:
    """RL step `step` + 1 (GRPO, PPO, ...): the rollout's batch, the train step, the settle, the logs."""
    t0 = time.perf_counter()
    run.ctx.progress(f"step {step + 1}: rollout")  # the watchdog names a process that stops making progress
    rollout, batch, info = run.rollout.produce(
        state.rollout, state.train.params, state.train.rng["rollout"], step
    )
    t1 = time.perf_counter()
    run.ctx.progress(f"step {step + 1}: train step")
    train_state, metrics, outputs = run.train_step(state.train, batch, state.frozen)
    m = {k: float(v) for k, v in run.ctx.host(metrics).items()}
    t2 = time.perf_counter()
    run.ctx.progress(f"step {step + 1}: settle and log")
    rollout = run.rollout.settle(rollout)
    t3 = time.perf_counter()
    run.step_times.append(t3 - t0)
    m.update(info.metrics)
    m.update({"time/rollout_s": t1 - t0, "time/train_s": t2 - t1, "time/rollout_wait_s": t3 - t2})
    m["time/step_s"] = t3 - t0
    run.memory_after_steps = memory_metrics()  # peaks so far (host RSS; device allocator on accelerators)
    m.update(run.memory_after_steps)
    n = step + 1
    run.logger.scalars(n, m)
    if n % run.cfg.log.every == 0 or n == run.cfg.steps:
        run.logger.histograms(n, run.ctx.host(outputs))
        run.print(progress.line(n, m, CONSOLE_KEYS))
    if run.cfg.log.sample_every and n % run.cfg.log.sample_every == 0:
        run.logger.samples(n, info.samples)
    return dataclasses.replace(state, train=train_state, rollout=rollout)


def finish(run: Run, state: RunState, step: int) -> dict:
    """Final evaluation (unless this step was evaluated), checkpoint, pass-rate table, results.json."""
    res = run.results
    if res.get("grpo_eval_step") != step:  # not yet evaluated at this step (or the run was extended)
        res["grpo"] = evaluate(run, state, step, "after GRPO")
        res["grpo_eval_step"] = step
    save(run, state, step)
    stats = jax.device_get(state.rollout.stats)
    rl = run.problems.rl
    table = PassRateTable.from_counts(
        [p.task_id for p in rl], stats.attempts, stats.passes, [p.level for p in rl]
    )
    rows = table.rows()
    run.logger.table(step, "pass_rates", rows)
    res["train_problems"] = table.summary()
    run.print(
        "training problems: {n_problems_seen} seen, {n_ever_solved} ever solved, mean pass rate "
        "{mean_pass_rate:.3f} (per-problem table: pass_rates.jsonl)".format(**res["train_problems"])
    )
    for row in rows[:3] + rows[-3:] if len(rows) > 6 else rows:
        run.print(
            f"  {row['task_id']:<28} {row['passes']:>4}/{row['attempts']:<4} pass rate {row['pass_rate']:.2f}"
        )
    if run.step_times:
        res["median_step_s_this_process"] = float(np.median(run.step_times))
        res["memory_grpo_this_process"] = run.memory_after_steps  # the peaks at the last RL step
    res["memory_this_process"] = memory_metrics()  # peaks including SFT and every evaluation
    if run.cfg.checkpoint.export_hf:
        out = os.path.join(run.cfg.workdir, "hf")
        export(run, state, out, overwrite=True)  # the run's own export (an extended run replaces it)
        res["exported_hf"] = out
    res["final_params_sha256"] = params_digest(state.train.params, fetch=run.ctx.host)
    res["steps"] = step
    res["wall_seconds_this_process"] = time.perf_counter() - run.t_start
    res["config"] = run.cfg.to_json()
    res["processes"], res["devices"] = run.ctx.count, run.mesh.size
    if run.ctx.is_main:
        write_json_atomic(os.path.join(run.cfg.workdir, "results.json"), res)
    run.print(final_table(res))
    return res
