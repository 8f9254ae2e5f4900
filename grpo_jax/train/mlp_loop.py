"""The host loop of the MLP actor-critic experiments (``python -m experiments.mlp_agent``): the jitted
trainers of ``grpo_jax.train.mlp_agent`` (GRPO on the toy bandits, PPO on the toy chain) with the main job's
logging, checkpoints, resume and results.

    cfg = MLPRunConfig(env="discrete", algorithm="grpo", workdir=..., steps=200, agent=GRPOAgentConfig())
    results = run(cfg)                  # also written to workdir/results.json

Files under ``workdir`` (as the main job's, grpo_jax.train.loop):

  run.json        the configuration (``"config"``: ``MLPRunConfig.to_json()``) and the run's environment, by
                  ``MetricsLogger``; a later start in the same workdir must have the same configuration but
                  for RESUMABLE (the step count, the logging / evaluation / checkpoint periods), else
                  MLPRunError.
  metrics.jsonl   one row per step (the trainer's metrics + ``time/step_s``) and one per evaluation
  tb/             (``eval/...``), also as TensorBoard scalars; a resumed run drops the rows after its
                  checkpoint, so each step appears once.
  checkpoints/    ``Checkpointer`` steps (orbax + checksums): the whole agent state (params, optimiser, the
                  frozen reference, step) and the host JSON (config, results so far).
  results.json    at the end (atomically): the final evaluation, the evaluations at every ``eval_every``
                  steps, the step count, wall seconds and the SHA-256 digest of the final params.

Random keys are named streams of ``cfg.seed`` (grpo_jax.rng): the policy's init, the rollout key that every
train step folds its step counter into, and one fixed evaluation key (every evaluation sees the same
observations / start positions, so the curve is not noise from the evaluation set). The task itself (the
bandit's hidden matrix) is drawn from ``cfg.seed`` as in tests/test_mlp_learning.py. The state holds the step
counter, so a run stopped after any step (``--steps=k``, a signal) and resumed ends bit-identical to one that
was not.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any, Literal

import jax

from grpo_jax import rng as rng_lib
from grpo_jax.config import flat_dict
from grpo_jax.envs import toy
from grpo_jax.policies import mlp
from grpo_jax.train import mlp_agent
from grpo_jax.train.checkpoint import (
    CheckpointCorruptError,
    Checkpointer,
    CheckpointMismatchError,
    SignalFlag,
)
from grpo_jax.train.console import Progress
from grpo_jax.train.export import params_digest
from grpo_jax.train.logging import MetricsLogger, write_json_atomic

ALGORITHMS = {"discrete": "grpo", "continuous": "grpo", "chain": "ppo"}  # env -> its one trainer
VALID = "--env=discrete or --env=continuous with --algorithm=grpo, --env=chain with --algorithm=ppo"
# the settings a resume may change (they do not change the trajectory)
RESUMABLE = ("steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints")
_POSITIVE = ("hidden", "obs_dim", "act_dim", "horizon", "eval_episodes", "log_every", "keep_checkpoints")
AgentConfig = mlp_agent.GRPOAgentConfig | mlp_agent.PPOAgentConfig


class MLPRunError(ValueError):
    """A run that cannot start, in one line: a bad combination, a workdir of another configuration, no
    intact checkpoint."""


def check_combination(env: str, algorithm: str) -> None:
    """MLPRunError (one line naming the valid ones) unless ``algorithm`` trains on ``env``."""
    if env not in ALGORITHMS:
        raise MLPRunError(f"--env={env}: valid: {', '.join(ALGORITHMS)}")
    if ALGORITHMS[env] != algorithm:
        raise MLPRunError(f"--algorithm={algorithm} with --env={env} is not supported: valid: {VALID}")


@dataclasses.dataclass(frozen=True)
class MLPRunConfig:
    """One MLP experiment: the task, the trainer's config (``agent``), the policy width and the host loop.

    Attributes:
      env: ``"discrete"`` / ``"continuous"`` (a ``toy`` bandit, GRPO) or ``"chain"`` (``toy.Chain``, PPO).
      algorithm: ``"grpo"`` or ``"ppo"``; only the combinations of ALGORITHMS are valid.
      workdir: the run's directory (created).
      steps: train steps in all (a resumed run continues up to this count).
      agent: ``GRPOAgentConfig`` (grpo) or ``PPOAgentConfig`` (ppo).
      seed: the run seed (the task, the policy init, the rollouts, the evaluation set).
      hidden: the MLP trunk width (the seed's default is 1024; 64 learns these tasks in seconds on a CPU).
      obs_dim, act_dim: the bandit's observation size and number of actions (discrete) / action dimension.
      chain_n, horizon: the chain's length and episode cut.
      eval_episodes: observations (bandit) or episodes (chain) per evaluation.
      log_every: a progress line every N steps (and at the last).
      eval_every: an evaluation every N steps (0: only at step 0 and at the end).
      checkpoint_every: a checkpoint every N steps (0: only at the end and on a signal).
      keep_checkpoints: the newest intact checkpoints kept.
    """

    env: str
    algorithm: str
    workdir: str
    steps: int
    agent: AgentConfig
    seed: int = 0
    hidden: int = 64
    obs_dim: int = 8
    act_dim: int = 8
    chain_n: int = 8
    horizon: int = 8
    eval_episodes: int = 1024
    log_every: int = 10
    eval_every: int = 50
    checkpoint_every: int = 50
    keep_checkpoints: int = 3

    def __post_init__(self) -> None:
        check_combination(self.env, self.algorithm)
        want = mlp_agent.GRPOAgentConfig if self.algorithm == "grpo" else mlp_agent.PPOAgentConfig
        if not isinstance(self.agent, want):
            raise MLPRunError(
                f"algorithm {self.algorithm} needs a {want.__name__}, got {type(self.agent).__name__}"
            )
        if self.env == "chain" and self.chain_n < 3:
            raise MLPRunError(f"--chain_n={self.chain_n}: must be >= 3 (starts are drawn from 0..n-3)")
        for name in ("steps", "log_every", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise MLPRunError(f"--{name}={getattr(self, name)}: must be >= 0")
        for name in _POSITIVE:
            if getattr(self, name) < 1:
                raise MLPRunError(f"--{name}={getattr(self, name)}: must be >= 1")
        if self.env == "discrete" and self.act_dim < 2:
            raise MLPRunError(f"--act_dim={self.act_dim}: the discrete bandit needs >= 2 actions")

    def to_json(self) -> dict:
        """Plain JSON values (the agent config and its loss config as nested dicts)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


@dataclasses.dataclass(frozen=True)
class Job:
    """The built pieces of one run: ``init()`` gives the step-0 state, ``train_step(state, train_key)`` the
    next state (donating the old) and its metrics, ``evaluate(params)`` the evaluation figures."""

    cfg: MLPRunConfig
    init: Callable[[], Any]
    train_step: Callable[[Any, jax.Array], tuple[Any, dict]]
    evaluate: Callable[[dict], dict]
    train_key: jax.Array
    console_keys: tuple[str, ...]
    about: str  # one line: the task and what chance / optimal is


def build(cfg: MLPRunConfig) -> Job:
    """The task, the policy, the jitted train step and evaluation of ``cfg``."""
    streams = rng_lib.streams(cfg.seed)
    init_key = rng_lib.derive(streams["init"], "mlp_policy")
    eval_key = rng_lib.derive(streams["eval"], "mlp_eval")
    agent = cfg.agent
    if isinstance(agent, mlp_agent.PPOAgentConfig):
        env = toy.Chain(n=cfg.chain_n, horizon=cfg.horizon)
        policy = mlp.MLPPolicyConfig(env.obs_dim, env.act_dim, "discrete", hidden=cfg.hidden)
        evaluate = jax.jit(functools.partial(mlp_agent.evaluate_chain, env=env, num=cfg.eval_episodes))
        start: Callable[[], Any] = functools.partial(mlp_agent.ppo_init, init_key, policy, agent)
        step: Callable = mlp_agent.make_ppo_train_step(env, agent)
        keys = ("episode_return", "pg_loss", "value_loss", "entropy")
        about = f"PPO on the chain (n {env.n}, horizon {env.horizon}): random return ~0.2, optimal 1"
    else:
        make = toy.make_discrete_bandit if cfg.env == "discrete" else toy.make_continuous_bandit
        task = make(seed=cfg.seed, obs_dim=cfg.obs_dim, act_dim=cfg.act_dim)
        kind: Literal["discrete", "continuous"] = "discrete" if cfg.env == "discrete" else "continuous"
        policy = mlp.MLPPolicyConfig(cfg.obs_dim, cfg.act_dim, kind, hidden=cfg.hidden)
        evaluate = jax.jit(functools.partial(mlp_agent.evaluate_bandit, task=task, num=cfg.eval_episodes))
        start = functools.partial(mlp_agent.grpo_init, init_key, policy, agent)
        step = mlp_agent.make_grpo_train_step(task, agent)
        keys = ("reward", "loss", "kl", "entropy")
        scale = f"success, chance {1 / cfg.act_dim:.3f}" if kind == "discrete" else "exp(-||a - a*||^2 / A)"
        about = (
            f"GRPO on the {cfg.env} bandit (obs {cfg.obs_dim}, A {cfg.act_dim}): reward {scale}, optimal 1"
        )
    return Job(
        cfg=cfg,
        init=start,
        train_step=step,
        evaluate=lambda params: evaluate(params, key=eval_key),
        train_key=streams["rollout"],
        console_keys=keys,
        about=about,
    )


def config_diff(cfg: MLPRunConfig, saved: Any) -> list[str]:
    """``"name: saved there, value here"`` for each setting (but RESUMABLE) where ``saved`` (a stored
    ``to_json()``) differs from ``cfg``; a ``saved`` that is not a dict differs in everything."""
    now = flat_dict(cfg.to_json())
    old = flat_dict(saved) if isinstance(saved, dict) else {}
    keys = sorted(
        k for k in set(now) | set(old) if k.split(".")[0] not in RESUMABLE and now.get(k) != old.get(k)
    )
    return [f"{k}: {old.get(k)!r} there, {now.get(k)!r} here" for k in keys]


def check_workdir(cfg: MLPRunConfig, saved: Any, what: str) -> None:
    """MLPRunError (one line) if ``saved`` (the config ``what`` holds) is not ``cfg`` but for RESUMABLE."""
    diff = config_diff(cfg, saved)
    if diff:
        more = f"; {len(diff) - 4} more" if len(diff) > 4 else ""
        raise MLPRunError(
            f"the workdir {cfg.workdir} holds a run with a different configuration ({what}: "
            f"{'; '.join(diff[:4])}{more}): use a new --workdir, or the same flags to resume it"
        )


def saved_config(workdir: str) -> Any:
    """The ``"config"`` of ``workdir/run.json`` (None without a run.json; MLPRunError if unreadable)."""
    path = os.path.join(workdir, "run.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MLPRunError(f"{path} is unreadable ({type(e).__name__}): use a new --workdir") from None


def restore(job: Job, ckpt: Checkpointer, print_fn: Callable[[str], Any]) -> tuple[Any, int, dict]:
    """(state, step, results so far) of the workdir's newest intact checkpoint, or the step-0 state."""
    template = job.init()
    if ckpt.latest_step() is None:
        return template, 0, {}
    try:
        state, host = ckpt.restore(template)
    except CheckpointMismatchError as e:
        raise MLPRunError(f"the workdir {job.cfg.workdir} holds a run with a different model: {e}") from None
    except (CheckpointCorruptError, FileNotFoundError) as e:
        raise MLPRunError(str(e)) from None
    check_workdir(job.cfg, host.get("config"), "its checkpoint")
    info = ckpt.last_restore
    skipped = info.line(ckpt.directory) if info is not None else None
    if skipped is not None:
        print_fn(skipped)
    step = int(state.step)
    results = dict(host.get("results") or {})
    results["resumed_from_step"] = step
    print_fn(f"resumed from {ckpt.directory} at step {step}")
    return state, step, results


def evaluate(job: Job, params: dict, step: int, logger: MetricsLogger, results: dict, print_fn) -> dict:
    """The evaluation after ``step`` steps: kept in ``results["evals"]``, logged as ``eval/...``, printed."""
    out = {k: float(v) for k, v in jax.device_get(job.evaluate(params)).items()}
    results.setdefault("evals", {})[str(step)] = out
    logger.scalars(step, {f"eval/{k}": v for k, v in out.items()})
    print_fn(f"[eval step {step}] " + "  ".join(f"{k} {v:.3f}" for k, v in out.items()))
    return out


def save(job: Job, ckpt: Checkpointer, state: Any, step: int, results: dict) -> None:
    ckpt.save(step, state, {"config": job.cfg.to_json(), "results": results}, force=True)


def train(
    job: Job, state: Any, step: int, ckpt: Checkpointer, logger: MetricsLogger, results: dict, print_fn
):
    """Train steps from ``step`` to ``cfg.steps``: (state, step, interrupted). A SIGTERM / SIGINT finishes the
    step, saves a checkpoint and stops."""
    cfg, t_start = job.cfg, time.perf_counter()
    progress = Progress(cfg.steps, start_step=step, print_fn=print_fn)
    stop = SignalFlag.install()
    try:
        while step < cfg.steps:
            t0 = time.perf_counter()
            state, metrics = job.train_step(state, job.train_key)
            m = {k: float(v) for k, v in jax.device_get(metrics).items()}
            m["time/step_s"] = time.perf_counter() - t0
            step += 1
            logger.scalars(step, m)
            if step % cfg.log_every == 0 or step == cfg.steps:
                print_fn(
                    f"{progress.line(step, m, job.console_keys)}  ({time.perf_counter() - t_start:.1f} s)"
                )
            if cfg.eval_every and step % cfg.eval_every == 0:
                evaluate(job, state.params, step, logger, results, print_fn)
            if stop.is_set() or ckpt.should_save(step):
                save(job, ckpt, state, step, results)
            if stop.is_set():
                print_fn(f"signal received: checkpoint saved at step {step}; exiting")
                return state, step, True
    finally:
        stop.uninstall()
    return state, step, False


def finish(job: Job, state: Any, step: int, ckpt: Checkpointer, logger: MetricsLogger, results: dict) -> dict:
    """The final evaluation (unless this step has one), the final checkpoint, and results.json."""
    final = results.get("evals", {}).get(str(step))
    if final is None:
        final = evaluate(job, state.params, step, logger, results, lambda _: None)
    save(job, ckpt, state, step, results)
    return {"final_eval": final, "steps": step, "params_sha256": params_digest(state.params), **results}


def run(cfg: MLPRunConfig, print_fn: Callable[[str], Any] = print) -> dict:
    """The whole run (a fresh start or a resume in ``cfg.workdir``); returns the results dict, also written to
    workdir/results.json (an interrupted run writes none and returns ``{"interrupted_at": step}``)."""
    t_start = time.perf_counter()
    if os.path.exists(os.path.join(cfg.workdir, "run.json")):  # before anything in the workdir is touched
        check_workdir(cfg, saved_config(cfg.workdir), "run.json")
    job = build(cfg)
    with Checkpointer(
        os.path.join(cfg.workdir, "checkpoints"), keep=cfg.keep_checkpoints, save_every=cfg.checkpoint_every
    ) as ckpt:
        state, step, results = restore(job, ckpt, print_fn)
        resumed = results.get("resumed_from_step")
        run_info = {"config": cfg.to_json(), "experiment": "mlp_agent", "resumed_from_step": resumed}
        # a resume drops the rows logged after its checkpoint; a fresh start every row an earlier start
        # (killed before its first checkpoint) left
        purge = 0 if resumed is None else step + 1
        with MetricsLogger(cfg.workdir, run_info=run_info, purge_step=purge) as logger:
            print_fn(f"{job.about}; {cfg.steps} steps (the first includes compilation)")
            if resumed is None:
                evaluate(job, state.params, 0, logger, results, print_fn)
            state, step, interrupted = train(job, state, step, ckpt, logger, results, print_fn)
            if interrupted:
                return {"interrupted_at": step}
            out = finish(job, state, step, ckpt, logger, results)
    wall = time.perf_counter() - t_start
    out = {**out, "wall_seconds_this_process": wall, "config": cfg.to_json()}
    write_json_atomic(os.path.join(cfg.workdir, "results.json"), out)
    final = "  ".join(f"{k} {v:.3f}" for k, v in out["final_eval"].items())
    print_fn(
        f"done: step {step}, {wall:.1f} s; final eval: {final}; params sha256 {out['params_sha256'][:16]}"
    )
    return out
