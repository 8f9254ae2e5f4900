"""The code-generation run: SFT warm start, then GRPO on sandboxed rewards, with evaluation, logging and
checkpoints. Host loop only — no math here (that is grpo_jax.core and grpo_jax.train.step).

    executor = Executor(...)                       # started before JAX is used
    results = run(cfg, executor)                   # cfg: CodegenConfig

One GRPO step: the rollout (grpo_jax.train.rollout: choose B problems with the step's "data" key -> sample G
completions each with the "sample" key -> sandbox -> rewards; optionally curriculum, replay, dynamic sampling,
the pool baseline) -> `train_step` (rollout-side state stripped off) -> pool push -> log. With async rewards
the rollout of step t+1 runs in a worker thread while step t trains. Evaluation (held-out pass@1 greedy,
pass@k sampled) runs after SFT, every `eval_every` steps and at the end, with the "eval" stream, so it never
changes the training trajectory.

Resume: the workdir's latest checkpoint holds the whole TrainState (params, optimizer, controllers, reference,
PRNG streams, step, pool, curriculum, replay, the pending async rollout) plus host state (results so far,
per-problem pass table, config); every per-step random choice is a function of (streams, step), so a run
killed at any point and restarted ends bit-identical to an uninterrupted run (tests/test_codegen_e2e.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import pool
from grpo_jax.codegen import pipeline, tasks
from grpo_jax.codegen.tokenizer import CodeTokenizer
from grpo_jax.config import LoRAConfig, ObjectiveConfig, OptimConfig, PoolConfig, RolloutConfig
from grpo_jax.curriculum import CurriculumConfig
from grpo_jax.policies import lora, sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.sandbox.executor import Executor
from grpo_jax.train import sft
from grpo_jax.train.checkpoint import Checkpointer, CheckpointMismatchError, SignalFlag
from grpo_jax.train.logging import MetricsLogger, PassRateTable, Progress, write_json_atomic
from grpo_jax.train.pool_host import PoolRuntime
from grpo_jax.train.rollout import Rollout, RolloutView, RolloutWorker, empty_batch
from grpo_jax.train.state import TrainState, init_state, make_optimizer, rng_streams
from grpo_jax.train.step import advantages, make_train_step, transformer_logits_fn


# fields that may change between a run and its resumption (they do not change the trajectory's meaning)
class RunConfigError(ValueError):
    """The run cannot start as configured (e.g. the workdir holds a different run)."""


RESUMABLE_CHANGES = (
    "workdir",
    "resume",
    "steps",
    "eval_every",
    "checkpoint_every",
    "log_every",
    "sample_log_every",
)


@dataclasses.dataclass(frozen=True)
class CodegenConfig:
    workdir: str
    model: tfm.TransformerConfig
    objective: ObjectiveConfig = ObjectiveConfig()
    optim: OptimConfig = OptimConfig(learning_rate=1e-4)
    rollout: RolloutConfig = RolloutConfig(group_size=8, max_new_tokens=24)
    pool: PoolConfig = PoolConfig()
    lora: LoRAConfig = LoRAConfig()
    # sparse-reward machinery (grpo_jax.train.rollout); every mechanism off by default
    curriculum: CurriculumConfig = CurriculumConfig()
    dynamic_sampling: bool = False  # DAPO: refill groups with all-equal rewards
    dynamic_max_rounds: int = 3  # extra sampling rounds at most per step
    replay_fraction: float = 0.0  # fraction of the B prompts whose G-th member is a replayed success
    replay_capacity: int = 1024
    replay_alpha: float = 1.0  # priority (1 - s(q) + eps) ** alpha
    async_rewards: bool = False  # grade step t+1 in the sandbox while the device trains on step t
    seed: int = 0
    # task suite
    sft_levels: tuple[int, ...] = (0, 1)
    rl_levels: tuple[int, ...] = (0, 1)
    eval_levels: tuple[int, ...] = (0, 1)
    train_per_level: int = 300
    heldout_per_level: int = 40
    prompt_len: int = 64
    # SFT warm start
    sft_steps: int = 300
    sft_batch: int = 32
    sft_lr: float = 3e-3
    # GRPO
    steps: int = 50
    prompts_per_step: int = 8
    # evaluation
    eval_every: int = 0  # 0: only after SFT and at the end
    eval_samples: int = 8
    eval_ks: tuple[int, ...] = (1, 8)
    eval_batch: int = 16
    # checkpoints and logging
    checkpoint_every: int = 25
    keep_checkpoints: int = 2
    log_every: int = 1
    sample_log_every: int = 10
    # sandbox
    sandbox_wall_s: float = 2.0
    sandbox_deadline_s: float = 120.0
    resume: bool = True  # continue from the workdir's latest checkpoint

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"{field}={getattr(self, field)!r}: {why}")

        for f in ("sft_levels", "rl_levels", "eval_levels"):
            levels = getattr(self, f)
            if not levels or any(lv not in tasks.LEVELS for lv in levels):
                bad(f, f"must be a non-empty subset of {tuple(tasks.LEVELS)}")
        for f in ("train_per_level", "heldout_per_level", "prompt_len", "sft_batch", "prompts_per_step"):
            if getattr(self, f) < 1:
                bad(f, "must be >= 1")
        for f in ("sft_steps", "steps", "eval_every", "checkpoint_every", "sample_log_every"):
            if getattr(self, f) < 0:
                bad(f, "must be >= 0")
        if self.log_every < 1:
            bad("log_every", "must be >= 1")
        if self.sft_lr <= 0:
            bad("sft_lr", "must be > 0")
        if self.eval_samples < 1 or any(k < 1 or k > self.eval_samples for k in self.eval_ks):
            bad("eval_ks", f"every k must be in [1, eval_samples={self.eval_samples}]")
        if self.prompts_per_step > self.train_per_level * len(self.rl_levels):
            bad("prompts_per_step", "must not exceed the number of RL training problems")
        if self.sandbox_wall_s <= 0 or self.sandbox_deadline_s <= 0:
            bad("sandbox_wall_s", "sandbox_wall_s and sandbox_deadline_s must be > 0")
        if self.model.vocab_size != CodeTokenizer().vocab_size:
            bad("model", f"vocab_size must be the tokenizer's ({CodeTokenizer().vocab_size})")
        if not 0 <= self.replay_fraction < 1:
            bad("replay_fraction", "must be in [0, 1)")
        if self.replay_fraction > 0 and self.replay_capacity < self.prompts_per_step:
            bad("replay_capacity", f"must be >= prompts_per_step={self.prompts_per_step}")
        if self.dynamic_max_rounds < 0:
            bad("dynamic_max_rounds", "must be >= 0")
        if (self.replay_fraction > 0 or self.async_rewards) and self.objective.loss.tis_cap is None:
            bad(
                "objective",
                "replayed and asynchronous rollouts are off-policy: set the truncated importance-sampling "
                "cap (--tis_cap, e.g. 2.0)",
            )
        if self.objective.baseline != "group" and not self.pool.enabled:
            bad("objective", f"baseline={self.objective.baseline!r} needs a policy pool (pool capacity > 0)")

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


def params_digest(params: Any) -> str:
    """SHA-256 over every parameter's bytes (leaf order fixed by the pytree): equal digests = equal bits."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(params)):
        a = np.ascontiguousarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def make_param_fn(cfg: LoRAConfig):
    """(trainable, frozen) -> full model parameters: None for full fine-tuning, LoRA merge otherwise."""
    if not cfg.enabled:
        return None

    def fn(adapters, base):
        return lora.merge(jax.lax.stop_gradient(base), adapters, alpha=cfg.alpha)

    return fn


def fresh_state(cfg: CodegenConfig, params: Any, optimizer, worker: RolloutWorker) -> TrainState:
    """The GRPO TrainState that starts from `params` (the SFT policy): LoRA adapters (B = 0) over the frozen
    base when cfg.lora is on, an empty pool shaped like the trainable parameters when cfg.pool is on, the
    curriculum and replay states, and (async rollouts) a placeholder for the pending rollout batch."""
    frozen = None
    if cfg.lora.enabled:
        key = jax.random.fold_in(rng_streams(cfg.seed)["init"], 1)
        frozen, params = params, lora.init(params, key, rank=cfg.lora.rank, targets=cfg.lora.targets)
    p = pool.init(params, cfg.pool.capacity) if cfg.pool.enabled else None
    state = init_state(params, cfg.objective, optimizer, seed=cfg.seed, frozen=frozen, pool=p)
    pending = None
    if cfg.async_rewards:
        shape = (cfg.prompts_per_step, cfg.rollout.group_size, cfg.prompt_len, cfg.rollout.max_new_tokens)
        pending = empty_batch(*shape, worker.num_tests)
    return state.replace(curriculum=worker.init_curriculum(), replay=worker.init_replay(), pending=pending)


def policy_params(state: TrainState, param_fn) -> Any:
    """The full parameters of the current policy (sampling, evaluation)."""
    return state.params if param_fn is None else param_fn(state.params, state.frozen)


class _Sampling:
    """Jitted samplers for training (group G, temperature) and evaluation (greedy, n samples)."""

    def __init__(self, cfg: CodegenConfig, tok: CodeTokenizer):
        self.cfg, self.tok = cfg, tok
        r = cfg.rollout
        self.sp_train = sampling.sampling_params(r.temperature, r.top_k, r.top_p)
        self.sp_greedy = sampling.sampling_params(0.0)

    def sampler(self, n: int):
        return sampling.make_sampler(
            self.cfg.model,
            group=n,
            max_new=self.cfg.rollout.max_new_tokens,
            eos_id=self.tok.eos_id,
            pad_id=self.tok.pad_id,
        )

    def eval_fn(self, params, key) -> Callable:
        counter = [0]

        def fn(prompt, pmask, n, greedy):
            counter[0] += 1
            k = jax.random.fold_in(key, counter[0])
            sp = self.sp_greedy if greedy else self.sp_train
            out = self.sampler(n)(params, jnp.asarray(prompt), jnp.asarray(pmask), k, sp)
            return np.asarray(out.tokens), np.asarray(out.mask)

        return fn


def run(cfg: CodegenConfig, executor: Executor, print_fn: Callable[[str], None] = print) -> dict:
    """The whole run; returns the results dict (also written to workdir/results.json)."""
    os.makedirs(cfg.workdir, exist_ok=True)
    tok = CodeTokenizer()
    t_start = time.perf_counter()
    train_sft = tasks.make_split(
        "train", levels=cfg.sft_levels, n_per_level=cfg.train_per_level, seed=cfg.seed
    )
    train_rl = tasks.make_split("train", levels=cfg.rl_levels, n_per_level=cfg.train_per_level, seed=cfg.seed)
    heldout = tasks.make_split(
        "heldout", levels=cfg.eval_levels, n_per_level=cfg.heldout_per_level, seed=cfg.seed
    )
    print_fn(
        f"task suite: {len(train_sft)} SFT / {len(train_rl)} RL training problems (levels {cfg.sft_levels} / "
        f"{cfg.rl_levels}), {len(heldout)} held-out (levels {cfg.eval_levels}); sandbox tier {executor.tier}"
    )
    samp = _Sampling(cfg, tok)
    optimizer = make_optimizer(cfg.optim)
    ckpt = Checkpointer(os.path.join(os.path.abspath(cfg.workdir), "checkpoints"), keep=cfg.keep_checkpoints)
    pass_table = PassRateTable()
    results: dict[str, Any] = {}
    latest = ckpt.latest_step()
    if latest is not None and not cfg.resume:
        raise RunConfigError(
            f"workdir {cfg.workdir} already holds checkpoints (latest step {latest}) and resume is off: "
            "use a new --workdir, or drop --noresume to continue that run"
        )
    state = None
    param_fn = make_param_fn(cfg.lora)
    pool_rt = None
    if cfg.pool.enabled:
        pool_rt = PoolRuntime(
            cfg.pool,
            cfg.rollout,
            cfg.model,
            tok,
            uses_baseline=cfg.objective.baseline != "group",
            member_fn=param_fn,
            deadline_s=cfg.sandbox_deadline_s,
        )
    worker = RolloutWorker(cfg, tok, executor, train_rl, pool_rt)
    host: dict[str, Any] = {}
    if latest is not None:
        template = fresh_state(
            cfg, tfm.init_params(cfg.model, jax.random.PRNGKey(cfg.seed)), optimizer, worker
        )
        try:
            state, host = ckpt.restore(template, latest)
        except CheckpointMismatchError as e:
            raise RunConfigError(
                f"the workdir {cfg.workdir} holds a run with a different model: {e}"
            ) from None
        _check_resumable(cfg, host["config"])
        results = host["results"]
        pass_table.load_state_dict(host["pass_table"])
        print_fn(f"resumed from {ckpt.directory} at GRPO step {int(state.step)}")
    logger = MetricsLogger(
        cfg.workdir,
        run_info={"config": cfg.to_json(), "tokenizer": tok.fingerprint()},
        purge_step=None if state is None else int(state.step) + 1,
    )

    def evaluate(params, key, tag):
        t = time.perf_counter()
        res = pipeline.evaluate(
            samp.eval_fn(params, key),
            executor,
            tok,
            heldout,
            n_samples=cfg.eval_samples,
            ks=cfg.eval_ks,
            prompt_len=cfg.prompt_len,
            batch=cfg.eval_batch,
            deadline_s=cfg.sandbox_deadline_s,
        )
        res["seconds"] = time.perf_counter() - t
        print_fn(f"[eval {tag}] " + "  ".join(f"{k} {res[k]:.3f}" for k in _headline(res)))
        return res

    # ---- SFT warm start (skipped when resuming)
    if state is None:
        params = tfm.init_params(cfg.model, jax.random.PRNGKey(cfg.seed))
        t = time.perf_counter()
        data = pipeline.sft_examples(tok, train_sft, cfg.prompt_len, cfg.rollout.max_new_tokens)
        sft_opt = make_optimizer(OptimConfig(learning_rate=cfg.sft_lr, warmup_steps=min(20, cfg.sft_steps)))
        params, sft_hist = sft.sft_train(
            params,
            cfg.model,
            sft_opt,
            data,
            steps=cfg.sft_steps,
            batch_size=cfg.sft_batch,
            seed=cfg.seed,
            log_every=max(1, cfg.sft_steps // 5) if cfg.sft_steps else 0,
            print_fn=print_fn,
        )
        results["sft_seconds"] = time.perf_counter() - t
        if sft_hist:
            results["sft_final_loss"] = sft_hist[-1]["loss"]
        state = fresh_state(cfg, params, optimizer, worker)
        if cfg.lora.enabled:
            n_ad, n_all = lora.num_params(state.params), lora.num_params(state.frozen)
            print_fn(f"LoRA rank {cfg.lora.rank}: training {n_ad} adapter parameters, base ({n_all}) frozen")
        results["sft"] = evaluate(policy_params(state, param_fn), state.key("eval"), "after SFT")
        logger.scalars(0, {_eval_tag(k): v for k, v in results["sft"].items()})
        if cfg.async_rewards:  # the first rollout, so that every checkpoint holds the pending one
            first = worker.produce(_view(state, param_fn, pool_rt, copy=False), 0)
            state = _apply(state, first, pass_table).replace(pending=first.batch)
            host = {"pending": _pending_host(first)}
        ckpt.save(0, state, _host(cfg, results, pass_table, host.get("pending")), force=True)

    # ---- GRPO
    train_step = make_train_step(
        transformer_logits_fn(cfg.model),
        cfg.objective,
        optimizer,
        temperature=cfg.rollout.temperature,
        param_fn=param_fn,
    )
    progress = Progress(cfg.steps, start_step=int(state.step), print_fn=print_fn)
    stop = SignalFlag.install()
    keys = ("reward", "Performance/SuccessRate", "frac_reward_zero_std", "kl", "entropy", "grad_norm")
    threads = ThreadPoolExecutor(max_workers=1) if cfg.async_rewards else None
    step_times: list[float] = []
    current: Rollout | None = None
    if cfg.async_rewards and int(state.step) < cfg.steps:  # the pending rollout restored with the state
        ph = host.get("pending") or {}
        current = Rollout(
            state.pending, state.curriculum, state.replay, ph.get("metrics", {}), ph.get("samples", []), []
        )
    try:
        while int(state.step) < cfg.steps:
            step = int(state.step)
            t0 = time.perf_counter()
            if current is None:  # synchronous: this step's rollout from the current policy
                current = worker.produce(_view(state, param_fn, pool_rt, copy=False), step)
                state = _apply(state, current, pass_table)
            future = None
            if threads is not None:  # grade step+1 while the device trains on this step (one step off-policy)
                future = threads.submit(worker.produce, _view(state, param_fn, pool_rt, copy=True), step + 1)
            t2 = time.perf_counter()
            batch = current.batch
            rollout_states = (state.pool, state.curriculum, state.replay)
            core, metrics = train_step(
                state.replace(pool=None, curriculum=None, replay=None, pending=None), batch
            )
            m = {k: float(v) for k, v in jax.device_get(metrics).items()}
            state = core.replace(
                pool=rollout_states[0], curriculum=rollout_states[1], replay=rollout_states[2]
            )
            t_train = time.perf_counter() - t2
            m.update(current.metrics)
            if pool_rt is not None:
                log_now = (step + 1) % cfg.log_every == 0
                state, pm = pool_rt.after_step(state, step + 1, with_diversity=log_now)
                m.update(pm)
            nxt = None
            if future is not None:
                nxt = future.result()
                state = _apply(state, nxt, pass_table).replace(pending=nxt.batch)
            t3 = time.perf_counter()
            step_times.append(t3 - t0)
            m.update({"time/train_s": t_train, "time/step_s": t3 - t0})
            if threads is not None:
                m["time/async_wait_s"] = t3 - t2 - t_train
            logger.scalars(step + 1, m)
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                adv = advantages(batch, cfg.objective)
                logger.histograms(
                    step + 1, {"advantages": np.asarray(adv), "rewards": np.asarray(batch.rewards)}
                )
                print_fn(progress.line(step + 1, m, keys))
            if cfg.sample_log_every and (step + 1) % cfg.sample_log_every == 0:
                logger.samples(step + 1, current.samples)
            current = nxt
            pending_host = _pending_host(nxt) if nxt is not None else None
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                res = evaluate(policy_params(state, param_fn), state.key("eval"), f"step {step + 1}")
                logger.scalars(step + 1, {_eval_tag(k): v for k, v in res.items()})
                results.setdefault("evals", {})[str(step + 1)] = res
            done = step + 1 == cfg.steps
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0 and not done:
                ckpt.save(step + 1, state, _host(cfg, results, pass_table, pending_host), force=True)
            if done:
                host["pending"] = pending_host
            if stop.is_set():
                ckpt.save(step + 1, state, _host(cfg, results, pass_table, pending_host), force=True)
                print_fn(f"signal received: checkpoint saved at step {step + 1}; exiting")
                results["interrupted_at"] = step + 1
                return results
    finally:
        stop.uninstall()
        if threads is not None:
            threads.shutdown(wait=True)
    if step_times:
        results["median_step_s_this_process"] = float(np.median(step_times))

    # ---- final evaluation and results
    if results.get("grpo_eval_step") != int(state.step):  # not yet evaluated at this step (or run extended)
        results["grpo"] = evaluate(policy_params(state, param_fn), state.key("eval"), "after GRPO")
        results["grpo_eval_step"] = int(state.step)
        logger.scalars(int(state.step), {_eval_tag(k): v for k, v in results["grpo"].items()})
    ckpt.save(int(state.step), state, _host(cfg, results, pass_table, host.get("pending")), force=True)
    ckpt.close()
    logger.table(int(state.step), "pass_rates", pass_table.rows())
    results["train_problems"] = pass_table.summary()
    rows = pass_table.rows()
    print_fn(
        "training problems: {n_problems_seen} seen, {n_ever_solved} ever solved, mean pass rate "
        "{mean_pass_rate:.3f} (per-problem table: pass_rates.jsonl)".format(**results["train_problems"])
    )
    for r in rows[:3] + rows[-3:] if len(rows) > 6 else rows:
        print_fn(f"  {r['task_id']:<28} {r['passes']:>4}/{r['attempts']:<4} pass rate {r['pass_rate']:.2f}")
    results["final_params_sha256"] = params_digest(state.params)
    results["steps"] = int(state.step)
    results["wall_seconds_this_process"] = time.perf_counter() - t_start
    results["config"] = cfg.to_json()
    write_json_atomic(os.path.join(cfg.workdir, "results.json"), results)
    print_fn(final_table(results))
    logger.close()
    return results


def _host(cfg: CodegenConfig, results: dict, table: PassRateTable, pending: dict | None = None) -> dict:
    out = {"config": cfg.to_json(), "results": results, "pass_table": table.state_dict()}
    if pending is not None:
        out["pending"] = pending
    return out


def _pending_host(r: Rollout) -> dict:
    """The host-side part of a pending (already graded) rollout, checkpointed beside state.pending."""
    return {"metrics": r.metrics, "samples": r.samples}


def _view(state: TrainState, param_fn, pool_rt, *, copy: bool) -> RolloutView:
    """What a rollout reads. copy=True (async: the train step donates the state while the rollout runs)
    copies the sampling parameters, the frozen base and the PRNG streams."""
    params, frozen, rng = policy_params(state, param_fn), state.frozen, state.rng
    if copy:
        params, frozen, rng = (jax.tree.map(jnp.copy, x) for x in (params, frozen, rng))
    uses_pool = pool_rt is not None and pool_rt.uses_baseline
    return RolloutView(
        params=params,
        rng=rng,
        curriculum=state.curriculum,
        replay=state.replay,
        pool=state.pool if uses_pool else None,
        frozen=frozen,
    )


def _apply(state: TrainState, r: Rollout, table: PassRateTable) -> TrainState:
    """Fold a graded rollout's host and rollout-side state updates in (pass table, curriculum, replay)."""
    if r.passes:
        table.update([t for t, _ in r.passes], [p for _, p in r.passes])
    return state.replace(curriculum=r.curriculum, replay=r.replay)


def _check_resumable(cfg: CodegenConfig, saved: dict) -> None:
    now = cfg.to_json()
    diff = sorted(
        k for k in set(now) | set(saved) if k not in RESUMABLE_CHANGES and now.get(k) != saved.get(k)
    )
    if diff:
        raise RunConfigError(
            f"the workdir {cfg.workdir} holds a run with a different configuration ({', '.join(diff)}); "
            "use a new --workdir or --noresume"
        )


def _eval_tag(key: str) -> str:
    """TensorBoard tag of an evaluation metric ("pass@8" -> "eval/pass_at_8"; TB would mangle the "@")."""
    return "eval/" + key.replace("@", "_at_")


def _headline(res: dict) -> list[str]:
    return [k for k in res if k.startswith("pass@") or k.startswith("level")]


def final_table(results: dict) -> str:
    sft_r, grpo_r = results.get("sft", {}), results.get("grpo", {})
    keys = [k for k in sft_r if k.startswith("pass@") or k.endswith("/pass@1")]
    lines = ["", f"{'held-out metric':<24}{'after SFT':>12}{'after GRPO':>12}"]
    for k in keys:
        g = grpo_r.get(k)
        lines.append(f"{k:<24}{sft_r[k]:>12.3f}{(f'{g:.3f}' if g is not None else '-'):>12}")
    return "\n".join(lines)
