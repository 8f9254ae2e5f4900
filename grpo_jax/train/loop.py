"""The code-generation run in phases: set-up / resume, warm start, GRPO steps, evaluation, finish.

    executor = Executor(...)                        # the sandbox, started by the caller
    results = run(cfg, executor)                    # cfg: grpo_jax.config.RunConfig

    setup(cfg, executor)   tasks, tokenizer, model, optimizer, checkpointer, rollout, samplers; the latest
                           checkpoint restored (RunState + host JSON) when the workdir holds one
    warm_start(run)        model init, SFT, LoRA adapters over the frozen base, evaluation after SFT, step 0
    train(run, state)      GRPO steps until cfg.steps (or a signal): checkpoints, periodic evaluation
      rl_step            rollout.produce -> train_step -> rollout.settle -> log
    evaluate(run, state)   held-out pass@1 greedy and pass@k sampled (the "eval" stream: the training
                           trajectory never depends on it)
    finish(run, state)     final evaluation, pass-rate table, results.json

Host loop only, no math (grpo_jax.core, grpo_jax.train.step). Resume: the RunState (train state, rollout
state, frozen base) and host JSON (results so far, the rollout's host part, the config) are checkpointed
together; every random choice is a named key of (stream, step), so a run killed at any point and restarted
ends bit-identical to an uninterrupted one (tests/test_codegen_e2e.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import rng as rng_lib
from grpo_jax.codegen import datasets, pipeline, tasks
from grpo_jax.config import (
    RESUMABLE_CHANGES,
    DistConfig,
    MeshConfig,
    OptimConfig,
    RunConfig,
    flat_dict,
    from_leaves,
    is_sft_input,
    migrate_saved,
)
from grpo_jax.policies import lora, sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.sandbox.executor import Executor
from grpo_jax.tokenization.code import CodeTokenizer
from grpo_jax.train import distributed, sft, sharding
from grpo_jax.train.checkpoint import Checkpointer, CheckpointMismatchError, SignalFlag
from grpo_jax.train.logging import (
    MetricsLogger,
    PassRateTable,
    Progress,
    memory_metrics,
    write_json_atomic,
)
from grpo_jax.train.rollout import make_rollout
from grpo_jax.train.state import RunState, init_state, make_optimizer
from grpo_jax.train.step import make_train_step, transformer_logits_fn

CONSOLE_KEYS = ("reward", "Performance/SuccessRate", "frac_reward_zero_std", "kl", "entropy", "grad_norm")


class RunConfigError(ValueError):
    """The run cannot start as configured (e.g. the workdir holds a different run)."""


@dataclasses.dataclass
class Run:
    """Everything one process builds once for a run (host objects; the RunState is separate)."""

    cfg: RunConfig
    executor: Executor
    tok: CodeTokenizer
    model: tfm.TransformerConfig
    sft_problems: list
    rl_problems: list
    heldout: list
    optimizer: Any
    param_fn: Callable | None
    ckpt: Checkpointer
    rollout: Any
    train_step: Callable
    print: Callable[[str], None]
    notes: Sequence[str]
    ctx: distributed.Context
    mesh: Any
    template: Any  # the RunState's shapes, dtypes and shardings (state_template; the restore template)
    state_sh: Any  # the same shardings alone (jit in/out shardings)
    pretrained: Any = None  # the checkpoint's parameters (init_from), consumed by warm_start
    extra_evals: dict = dataclasses.field(default_factory=dict)  # {"mbpp": [...], "humaneval": [...]}
    logger: MetricsLogger | None = None
    results: dict = dataclasses.field(default_factory=dict)
    t_start: float = dataclasses.field(default_factory=time.perf_counter)
    step_times: list = dataclasses.field(default_factory=list)
    memory_after_steps: dict = dataclasses.field(default_factory=dict)  # memory_metrics() at the last step


class NullLogger:
    """The logger of processes other than 0 (they write nothing)."""

    def scalars(self, *a, **k) -> None: ...

    def histograms(self, *a, **k) -> None: ...

    def samples(self, *a, **k) -> None: ...

    def table(self, *a, **k) -> None: ...

    def close(self) -> None: ...


def run(cfg: RunConfig, executor: Executor, print_fn: Callable[[str], None] = print, notes=()) -> dict:
    """The whole run; returns the results dict (also written to workdir/results.json)."""
    r, state = setup(cfg, executor, print_fn, notes)
    try:
        if state is None:
            state = warm_start(r)
        state, interrupted = train(r, state)
        return r.results if interrupted else finish(r, state)
    finally:
        _close(r)


def _close(r: Run) -> None:
    r.rollout.close()
    r.ckpt.close()
    if r.logger is not None:
        r.logger.close()


# ------------------------------------------------------------------------------------------------------------
# set-up / resume
# ------------------------------------------------------------------------------------------------------------


def setup(cfg: RunConfig, executor: Executor, print_fn, notes) -> tuple[Run, RunState | None]:
    """Build the run's host objects; restore the workdir's latest checkpoint if there is one."""
    r = build(cfg, executor, print_fn, notes)
    try:
        state = _restore(r)
        if state is None and cfg.sft.from_workdir:
            check_sft_source(cfg)  # before anything is logged
    except BaseException:
        _close(r)
        raise
    if state is not None:
        r.pretrained = None  # the checkpoint's weights replace the pretrained ones
    run_info = {"config": cfg.to_json(), "tokenizer": r.tok.fingerprint(), "notes": list(r.notes)}
    purge = None if state is None else int(state.train.step) + 1
    if r.ctx.is_main:  # one writer of logs, TensorBoard and run metadata
        r.logger = MetricsLogger(cfg.workdir, run_info=run_info, purge_step=purge)
    else:
        r.logger = NullLogger()
    return r, state


def build(cfg: RunConfig, executor: Executor | None, print_fn=print, notes=()) -> Run:
    """Problems, tokenizer, model, optimizer, checkpointer, mesh, train step and rollout of a run (no state).
    In a multi-process run every process builds the same; only process 0 prints."""
    ctx = distributed.context(cfg.dist)
    print_fn = ctx.print_fn(print_fn)
    mesh = run_mesh(cfg, ctx, print_fn)
    sft_p, rl_p, heldout, extra = problem_sets(cfg)
    if executor is not None and cfg.sandbox.time_limits == "reference":
        rl_p, heldout, extra = reference_limits(cfg, executor, rl_p, heldout, extra, print_fn, ctx)
    tok, model, pretrained = model_and_tokenizer(cfg, print_fn)
    t = cfg.tasks
    what = f"levels {t.sft_levels} / {t.rl_levels}" if t.source == "procedural" else "MBPP train split"
    print_fn(
        f"tasks: {len(sft_p)} SFT / {len(rl_p)} RL training problems ({what}), {len(heldout)} held-out"
        f"{''.join(f', {len(v)} {k}' for k, v in extra.items())}; prompts {t.prompt_format}"
        + (f"; sandbox tier {executor.tier}" if executor is not None else "")
    )
    param_fn = None
    if cfg.lora.enabled:

        def param_fn(adapters, base):
            return lora.merge(jax.lax.stop_gradient(base), adapters, alpha=cfg.lora.alpha)

    optimizer = make_optimizer(cfg.optim)
    os.makedirs(cfg.workdir, exist_ok=True)
    ckpt = Checkpointer(os.path.join(os.path.abspath(cfg.workdir), "checkpoints"), keep=cfg.checkpoint.keep)
    batch_sh = sharding.batch_sharding(mesh)
    rollout = make_rollout(cfg, tok, executor, rl_p, model, param_fn, ctx=ctx, batch_sharding=batch_sh)
    args = (cfg, executor, tok, model, sft_p, rl_p, heldout, optimizer, param_fn, ckpt, rollout, None)
    r = Run(*args, print_fn, tuple(notes), ctx, mesh, None, None, pretrained=pretrained, extra_evals=extra)
    r.template = state_template(r)
    r.state_sh = jax.tree.map(lambda a: a.sharding, r.template)
    values = model.value_head  # PPO: the critic's values come from the same forward as the log-probs
    policy = dict(logits_fn=transformer_logits_fn(model, with_values=values), logp_fn=None)
    if cfg.model.logp_chunk:
        from grpo_jax.policies.logp import make_logp_fn

        policy = dict(logits_fn=None, logp_fn=make_logp_fn(model, cfg.model.logp_chunk, with_values=values))
    r.train_step = make_train_step(
        policy["logits_fn"],
        cfg.objective,
        optimizer,
        temperature=cfg.rollout.temperature,
        param_fn=param_fn,
        logp_fn=policy["logp_fn"],
        shardings=(r.state_sh.train, batch_sh, r.state_sh.frozen),
        micro_batches=cfg.optim.micro_batches,
    )
    return r


def run_mesh(cfg: RunConfig, ctx: distributed.Context, print_fn=print):
    """The run's mesh over every device of every process, checked against the batch it must split."""
    m = cfg.mesh
    try:
        mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor)
    except sharding.MeshError as e:
        raise RunConfigError(str(e)) from None
    if ctx.multi and cfg.rollout.async_rewards:
        # the async rollout's worker thread would run collectives and key-value exchanges concurrently with
        # the train step's, in an order that can differ between processes
        raise RunConfigError(
            "--async_rewards runs with one process only (its rollout thread's collectives would interleave "
            f"with the train step's differently in each of the {ctx.count} processes); drop it, or use one "
            "process with several devices"
        )
    dp = sharding.batch_parallelism(mesh)
    B, parts = cfg.rollout.prompts_per_step, cfg.objective.mini_batches * cfg.optim.micro_batches
    if (B // parts) % dp:
        raise RunConfigError(
            f"--prompts_per_step={B} / (--mini_batches x --micro_batches = {parts}) = {B // parts} "
            f"prompts per micro-batch must be divisible by the batch's split over the mesh, data x fsdp = "
            f"{dp} ({jax.device_count()} devices: "
            + ", ".join(f"{a} {mesh.shape[a]}" for a in sharding.AXES)
            + ")"
        )
    if mesh.size > 1 or ctx.multi:
        shape = " x ".join(f"{a} {mesh.shape[a]}" for a in sharding.AXES)
        print_fn(
            f"mesh: {shape} over {mesh.size} {jax.devices()[0].platform} devices in {ctx.count} process(es)"
        )
    return mesh


def state_template(r: Run) -> RunState:
    """The RunState's shapes and dtypes with its shardings (traced once per run; the restore template, and
    `r.state_sh`): train state and LoRA base by parameter specs (sharding.tree_shardings), the pool's members
    split over data (sharding.pool_shardings), the rest of the rollout state (curriculum, replay, pending
    batch, pool bookkeeping) replicated."""
    abstract = jax.eval_shape(lambda: fresh_state(r, tfm.init_params(r.model, jax.random.PRNGKey(0))))
    rep = sharding.replicated(r.mesh)
    rollout = jax.tree.map(lambda _: rep, abstract.rollout)
    if abstract.rollout.pool is not None:  # the pool's K snapshots split over the data axis
        rollout = rollout.replace(pool=sharding.pool_shardings(abstract.rollout.pool, r.mesh))
    shardings = RunState(
        train=sharding.tree_shardings(abstract.train, r.mesh),
        rollout=rollout,
        frozen=sharding.tree_shardings(abstract.frozen, r.mesh),
    )
    return jax.tree.map(
        lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), abstract, shardings
    )


def placed_state(r: Run, params: Any) -> RunState:
    """fresh_state(r, params) built straight into the run's shardings: the (host or local) parameters are
    placed by their specs first, so a checkpoint's weights and the optimizer moments never sit whole on one
    device."""
    params = sharding.put(params, sharding.tree_shardings(params, r.mesh))
    return jax.jit(lambda p: fresh_state(r, p), out_shardings=r.state_sh)(params)


def open_checkpoint(workdir: str, step: int | None = None, print_fn=print) -> tuple[Run, RunState]:
    """The Run (no sandbox, no logger) and the RunState of a workdir's checkpoint (latest, or `step`), with
    the configuration the run saved — for export and inspection. Close with `r.ckpt.close()`."""
    with open(os.path.join(workdir, "run.json"), encoding="utf-8") as f:
        saved = json.load(f)["config"]
    cfg = from_leaves(
        {**{k: _tuples(v) for k, v in migrate_saved(flat_dict(saved)).items()}, "workdir": workdir}
    )
    # this process's devices, whatever mesh and processes the run had (the checkpoint does not depend on them)
    cfg = dataclasses.replace(cfg, mesh=MeshConfig(), dist=DistConfig())
    r = build(cfg, None, print_fn)
    state, _ = r.ckpt.restore(r.template, step)
    r.rollout.bind(state.frozen)
    r.pretrained = None
    return r, state


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def problem_sets(cfg: RunConfig) -> tuple[list, list, list, dict]:
    """(SFT problems, RL problems, held-out problems, {name: extra evaluation problems})."""
    t = cfg.tasks
    if t.source == "mbpp":
        train, test = datasets.load_mbpp(split="train"), datasets.load_mbpp(split="test")
        sft_p, rl_p, heldout = train, train, test[: t.heldout_per_level]
    else:
        split = dict(n_per_level=t.train_per_level, seed=cfg.seed)
        sft_p = tasks.make_split("train", levels=t.sft_levels, **split)
        rl_p = tasks.make_split("train", levels=t.rl_levels, **split)
        heldout = tasks.make_split(
            "heldout", levels=t.eval_levels, n_per_level=t.heldout_per_level, seed=cfg.seed
        )
    extra = {}
    if cfg.eval.mbpp:
        extra["mbpp"] = datasets.load_mbpp(split="test")[: cfg.eval.mbpp]
    if cfg.eval.humaneval:
        extra["humaneval"] = datasets.load_humaneval()
    return sft_p, rl_p, heldout, extra


def reference_limits(cfg: RunConfig, executor: Executor, rl_p, heldout, extra, print_fn, ctx=None):
    """Every graded problem with its own wall limit from its reference's measured time (cached on disk).
    Several processes: process 0 measures and sends the limits to the others, so every sandbox grades
    with the same limits."""
    from grpo_jax.codegen.timelimits import with_reference_time_limits

    kw = dict(floor_s=cfg.sandbox.time_limit_floor_s, factor=cfg.sandbox.time_limit_factor)
    groups = [rl_p, heldout, *extra.values()]
    problems = [p for g in groups for p in g]

    def measure():
        flat, report = with_reference_time_limits(executor, problems, **kw)
        return [p.time_limit_s for p in flat], report

    limits, report = (ctx or distributed.Context()).broadcast_object("time_limits", measure)
    flat = [dataclasses.replace(p, time_limit_s=t) for p, t in zip(problems, limits, strict=True)]
    out, i = [], 0
    for g in groups:
        out.append(flat[i : i + len(g)])
        i += len(g)
    r = report
    print_fn(
        f"time limits: per problem {r['min_s']:.2f}–{r['max_s']:.2f} s (median {r['median_s']:.2f}; "
        f"{r['measured']} references measured, {r['cached']} cached, {r['failed_reference']} "
        f"without a passing reference keep {r['cap_s']} s)"
    )
    return out[0], out[1], dict(zip(extra, out[2:], strict=True))


def model_and_tokenizer(cfg: RunConfig, print_fn=print):
    """(tokenizer, TransformerConfig, pretrained params or None): the checkpoint of --init_from with its own
    tokenizer, or a fresh model of cfg.model's shape over the procedural tokenizer (or --tokenizer)."""
    m = cfg.model
    tok = CodeTokenizer()
    if m.tokenizer or m.init_from:
        from grpo_jax.pretrained.api import load_tokenizer

        tok = load_tokenizer(m.tokenizer or m.init_from)
    if not m.init_from:
        return tok, model_config(cfg, tok), None
    from grpo_jax.pretrained.api import load_pretrained

    t0 = time.perf_counter()
    model, params = load_pretrained(m.init_from)
    model = dataclasses.replace(
        model, compute_dtype=m.compute_dtype, remat=m.remat, value_head=cfg.objective.algorithm == "ppo"
    )
    params = with_value_head(params, model)
    if tok.vocab_size > model.vocab_size:
        raise RunConfigError(
            f"--tokenizer={m.tokenizer or m.init_from} has {tok.vocab_size} ids but the model of "
            f"--init_from={m.init_from} embeds {model.vocab_size}"
        )
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    print_fn(
        f"model: {m.init_from} ({n / 1e6:.1f} M parameters, {model.n_layers} layers, d {model.d_model}, "
        f"vocab {model.vocab_size}; loaded in {time.perf_counter() - t0:.1f} s)"
    )
    return tok, model, params


def model_config(cfg: RunConfig, tok) -> tfm.TransformerConfig:
    """The transformer of the run: cfg.model's shape over the tokenizer's vocabulary."""
    m = cfg.model
    return tfm.TransformerConfig(
        vocab_size=tok.vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        n_kv_heads=m.n_kv_heads,
        d_ff=m.d_ff,
        qkv_bias=m.qkv_bias,
        tie_embeddings=m.tie_embeddings,
        compute_dtype=m.compute_dtype,
        remat=m.remat,
        value_head=cfg.objective.algorithm == "ppo",  # the critic of --algorithm=ppo (shared trunk)
    )


def with_value_head(params: Any, model: tfm.TransformerConfig) -> Any:
    """`params` with a zero-initialised value head (as transformer.init_params makes it) when the model has
    one and the parameters do not (a pretrained checkpoint under --algorithm=ppo)."""
    if not model.value_head or "value_head" in params:
        return params
    dt = params["final_norm"].dtype
    head = {"kernel": np.zeros((model.d_model, 1), dt), "bias": np.zeros((1,), dt)}
    return {**params, "value_head": head}


def without_value_head(model: tfm.TransformerConfig, params: Any) -> tuple[tfm.TransformerConfig, Any]:
    """The policy alone (PPO's critic dropped): what a Hugging Face causal LM can hold."""
    if not model.value_head:
        return model, params
    policy = {k: v for k, v in params.items() if k != "value_head"}
    return dataclasses.replace(model, value_head=False), policy


def fresh_state(r: Run, params: Any) -> RunState:
    """The GRPO RunState that starts from `params` (the SFT policy): LoRA adapters (B = 0) over the frozen
    base when LoRA is on, the rollout's state (pool shaped like the trainable parameters, curriculum, ...)."""
    frozen = None
    if r.cfg.lora.enabled:
        key = rng_lib.derive(rng_lib.streams(r.cfg.seed)["init"], "lora")
        frozen, params = params, lora.init(params, key, rank=r.cfg.lora.rank, targets=r.cfg.lora.targets)
    train = init_state(params, r.cfg.objective, r.optimizer, seed=r.cfg.seed)
    return RunState(train=train, rollout=r.rollout.init_state(params), frozen=frozen)


def _restore(r: Run) -> RunState | None:
    latest = r.ckpt.latest_step()
    if latest is None:
        return None
    if not r.cfg.resume:
        raise RunConfigError(
            f"workdir {r.cfg.workdir} already holds checkpoints (latest step {latest}) and resume is off: "
            "use a new --workdir, or drop --noresume to continue that run"
        )
    try:
        state, host = r.ckpt.restore(r.template, latest)
    except CheckpointMismatchError as e:
        raise RunConfigError(f"the workdir {r.cfg.workdir} holds a run with a different model: {e}") from None
    _check_resumable(r.cfg, host["config"])
    r.results = host["results"]
    r.rollout.load_host_state(host.get("rollout", {}))
    r.rollout.bind(state.frozen)
    r.print(f"resumed from {r.ckpt.directory} at GRPO step {int(state.train.step)}")
    return state


def _check_resumable(cfg: RunConfig, saved: dict) -> None:
    now, old = flat_dict(cfg.to_json()), migrate_saved(flat_dict(saved))
    diff = sorted(k for k in set(now) | set(old) if k not in RESUMABLE_CHANGES and now.get(k) != old.get(k))
    if diff:
        raise RunConfigError(
            f"the workdir {cfg.workdir} holds a run with a different configuration ({', '.join(diff)}); "
            "use a new --workdir or --noresume"
        )


def _save(r: Run, state: RunState) -> None:
    host = {"config": r.cfg.to_json(), "results": r.results, "rollout": r.rollout.host_state()}
    r.ckpt.save(int(state.train.step), state, host, force=True)


# ------------------------------------------------------------------------------------------------------------
# warm start
# ------------------------------------------------------------------------------------------------------------


def warm_start(r: Run) -> RunState:
    """Model init and SFT on the reference solutions, the GRPO state over them, evaluation, checkpoint 0."""
    cfg, streams = r.cfg, rng_lib.streams(r.cfg.seed)
    if cfg.sft.from_workdir:  # another run's post-SFT parameters (equal SFT inputs: the same parameters)
        params = _sft_params_from(r)
    else:
        if r.pretrained is not None:
            params, r.pretrained = r.pretrained, None
        else:
            params = tfm.init_params(r.model, rng_lib.derive(streams["init"], "model"))
        if cfg.sft.steps:
            params = _sft(r, params, streams["sft"])
    state = placed_state(r, params)
    r.rollout.bind(state.frozen)
    if cfg.lora.enabled:
        n_ad, n_all = lora.num_params(state.train.params), lora.num_params(state.frozen)
        r.print(f"LoRA rank {cfg.lora.rank}: training {n_ad} adapter parameters, base ({n_all}) frozen")
    if r.model.value_head:
        r.print(
            f"PPO: the critic is a value head on the policy's trunk ({r.model.d_model + 1} parameters: one "
            f"D -> 1 projection per token; γ {cfg.objective.ppo.gamma}, λ {cfg.objective.ppo.lam}, "
            f"vf_coef {cfg.objective.ppo.vf_coef})"
        )
    r.results["sft"] = evaluate(r, state, "after SFT" if cfg.sft.steps else "before GRPO")
    _save(r, state)
    return state


def check_sft_source(cfg: RunConfig) -> None:
    """--sft_from=W: W is a run's workdir with a step-0 (post-SFT) checkpoint, and that run equals this one in
    every field that decides the post-SFT parameters (config.SFT_INPUTS); else RunConfigError saying what."""
    src = cfg.sft.from_workdir
    flag = f"--sft_from={src}"
    path = os.path.join(src, "run.json")
    if not os.path.isfile(path):
        raise RunConfigError(f"{flag}: no run.json there (not the workdir of a run)")
    with open(path, encoding="utf-8") as f:
        saved = migrate_saved(flat_dict(json.load(f)["config"]))
    now = flat_dict(cfg.to_json())
    diff = [k for k in sorted(set(now) | set(saved)) if is_sft_input(k) and now.get(k) != saved.get(k)]
    if diff:
        shown = "; ".join(f"{k}: {saved.get(k)!r} there, {now.get(k)!r} here" for k in diff[:6])
        raise RunConfigError(
            f"{flag}: that run's post-SFT parameters come from other settings ({shown}"
            f"{f'; {len(diff) - 6} more' if len(diff) > 6 else ''}); give a warm-start run with the same "
            "seed, model, SFT tasks and SFT settings, or drop --sft_from"
        )
    ckpts = os.path.join(src, "checkpoints")
    if not os.path.isdir(os.path.join(ckpts, "0")):
        kept = sorted(int(d) for d in os.listdir(ckpts) if d.isdigit()) if os.path.isdir(ckpts) else []
        raise RunConfigError(
            f"{flag}: no step-0 (post-SFT) checkpoint there (complete steps: {kept}); warm-start runs are "
            "run with --steps=0, or keep step 0 with --keep_checkpoints"
        )


def _sft_params_from(r: Run):
    """The post-SFT parameters of --sft_from's step-0 checkpoint (the LoRA base if that run had LoRA), as
    host arrays of the same tree as this run's own init."""
    src, t = r.cfg.sft.from_workdir, time.perf_counter()
    r.pretrained = None
    other, state = open_checkpoint(src, step=0, print_fn=lambda _: None)
    try:
        params = jax.device_get(state.frozen if other.cfg.lora.enabled else state.train.params)
    finally:
        other.rollout.close()
        other.ckpt.close()
    # the policy is what SFT made: a PPO source's value head (zero, SFT never trains it) is dropped, and this
    # run's own (zero) head is added when it is PPO, so GRPO and PPO arms share one warm start
    params = {k: v for k, v in params.items() if k != "value_head"}
    policy = dataclasses.replace(r.model, value_head=False)
    want = jax.eval_shape(lambda: tfm.init_params(policy, jax.random.PRNGKey(0)))
    spec = lambda tree: (jax.tree.structure(tree), [(x.shape, x.dtype) for x in jax.tree.leaves(tree)])
    if spec(params) != spec(want):
        raise RunConfigError(f"--sft_from={src}: its parameters are not of this run's model (tree or shapes)")
    params = with_value_head(params, r.model)
    r.results["sft_from"] = src
    try:
        with open(os.path.join(src, "results.json"), encoding="utf-8") as f:
            r.results["sft_final_loss"] = json.load(f)["sft_final_loss"]
    except (OSError, ValueError, KeyError):
        pass
    r.print(
        f"warm start: the post-SFT parameters of {src} (its step-0 checkpoint; SFT not repeated; "
        f"{time.perf_counter() - t:.1f} s)"
    )
    return params


def _sft(r: Run, params, key):
    cfg = r.cfg
    t = time.perf_counter()
    fmt = cfg.tasks.prompt
    data = pipeline.sft_examples(r.tok, r.sft_problems, cfg.tasks.prompt_len, cfg.rollout.max_new_tokens, fmt)
    warmup = min(cfg.sft.warmup_steps, cfg.sft.steps)
    sft_opt = make_optimizer(OptimConfig(learning_rate=cfg.sft.lr, warmup_steps=warmup))
    params, hist = sft.sft_train(
        params,
        r.model,
        sft_opt,
        data,
        steps=cfg.sft.steps,
        batch_size=cfg.sft.batch,
        key=key,
        log_every=max(1, cfg.sft.steps // 5),
        print_fn=r.print,
    )
    r.results["sft_seconds"] = time.perf_counter() - t
    r.results["sft_final_loss"] = hist[-1]["loss"]
    return params


# ------------------------------------------------------------------------------------------------------------
# GRPO
# ------------------------------------------------------------------------------------------------------------


def train(r: Run, state: RunState) -> tuple[RunState, bool]:
    """GRPO steps until cfg.steps; (state, interrupted). A SIGTERM/SIGINT finishes the step, saves, stops."""
    cfg = r.cfg
    progress = Progress(cfg.steps, start_step=int(state.train.step), print_fn=r.print)
    stop = SignalFlag.install()
    try:
        while int(state.train.step) < cfg.steps:
            r.ctx.barrier(f"step {int(state.train.step)}")  # a hung process ends the run here (PeerLost)
            state = rl_step(r, state, progress)
            r.ctx.idle()  # evaluation and checkpoints below have no progress deadline
            step = int(state.train.step)
            if r.ctx.multi and any(r.ctx.allgather_objects("stop", stop.is_set())):
                stop.set()  # a signal to any process stops them all at the same step (saves are collective)
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.steps:
                r.results.setdefault("evals", {})[str(step)] = evaluate(r, state, f"step {step}")
            if stop.is_set() or (
                cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < cfg.steps
            ):
                _save(r, state)
            if stop.is_set():
                r.print(f"signal received: checkpoint saved at step {step}; exiting")
                r.results["interrupted_at"] = step
                return state, True
    finally:
        stop.uninstall()
    return state, False


def rl_step(r: Run, state: RunState, progress: Progress) -> RunState:
    """One RL step (GRPO or PPO): the rollout's batch, the train step on it, the settle, the logs."""
    step = int(state.train.step)
    t0 = time.perf_counter()
    r.ctx.progress(f"step {step + 1}: rollout")  # the watchdog names a process that stops making progress
    rollout, batch, info = r.rollout.produce(
        state.rollout, state.train.params, state.train.rng["rollout"], step
    )
    t1 = time.perf_counter()
    r.ctx.progress(f"step {step + 1}: train step")
    train, metrics, outputs = r.train_step(state.train, batch, state.frozen)
    m = {k: float(v) for k, v in r.ctx.host(metrics).items()}
    t2 = time.perf_counter()
    r.ctx.progress(f"step {step + 1}: settle and log")
    rollout = r.rollout.settle(rollout)
    t3 = time.perf_counter()
    r.step_times.append(t3 - t0)
    m.update(info.metrics)
    m.update({"time/rollout_s": t1 - t0, "time/train_s": t2 - t1, "time/rollout_wait_s": t3 - t2})
    m["time/step_s"] = t3 - t0
    r.memory_after_steps = memory_metrics()  # peaks so far (host RSS; device allocator on accelerators)
    m.update(r.memory_after_steps)
    n = step + 1
    r.logger.scalars(n, m)
    if n % r.cfg.log.every == 0 or n == r.cfg.steps:
        r.logger.histograms(n, r.ctx.host(outputs))
        r.print(progress.line(n, m, CONSOLE_KEYS))
    if r.cfg.log.sample_every and n % r.cfg.log.sample_every == 0:
        r.logger.samples(n, info.samples)
    return state.replace(train=train, rollout=rollout)


# ------------------------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------------------------


def evaluate(r: Run, state: RunState, tag: str) -> dict:
    """Held-out metrics of the current policy, logged at the current step."""
    cfg = r.cfg
    step = int(state.train.step)
    params = state.train.params if r.param_fn is None else r.param_fn(state.train.params, state.frozen)
    key = rng_lib.derive(state.train.rng["eval"], step, "heldout")
    t = time.perf_counter()
    common = dict(batch=cfg.eval.batch, deadline_s=cfg.sandbox.deadline_s, fmt=cfg.tasks.prompt)
    res = pipeline.evaluate(
        _eval_sample_fn(r, params, key),
        r.executor,
        r.tok,
        r.heldout,
        n_samples=cfg.eval.samples,
        ks=cfg.eval.ks,
        prompt_len=cfg.tasks.prompt_len,
        **common,
    )
    for name, problems in r.extra_evals.items():  # greedy pass@1, prompts batched by length
        k = rng_lib.derive(state.train.rng["eval"], step, name)
        fn = _eval_sample_fn(r, params, k)
        more = pipeline.evaluate(
            fn, r.executor, r.tok, problems, n_samples=0, ks=(), prompt_len=None, **common
        )
        res[f"{name}/pass@1"] = more["pass@1"]
    res["seconds"] = time.perf_counter() - t
    r.print(
        f"[eval {tag}] "
        + "  ".join(f"{k} {res[k]:.3f}" for k in res if k.startswith(("pass@", "level")) or "/pass@" in k)
    )
    r.logger.scalars(step, {"eval/" + k.replace("@", "_at_"): v for k, v in res.items()})  # TB mangles "@"
    return res


def _eval_sample_fn(r: Run, params, key):
    """sample_fn(prompt, pmask, n, greedy) of grpo_jax.codegen.pipeline.evaluate: call i uses key (key, i)."""
    ro = r.cfg.rollout
    sp_sampled = sampling.sampling_params(ro.temperature, ro.top_k, ro.top_p)
    sp_greedy = sampling.sampling_params(0.0)
    calls = [0]

    def fn(prompt, pmask, n, greedy):
        calls[0] += 1
        sampler = sampling.make_sampler(
            r.model, group=n, max_new=ro.max_new_tokens, eos_id=pipeline.stop_ids(r.tok), pad_id=r.tok.pad_id
        )
        k = rng_lib.derive(key, calls[0])
        out = sampler(params, jnp.asarray(prompt), jnp.asarray(pmask), k, sp_greedy if greedy else sp_sampled)
        return r.ctx.host((out.tokens, out.mask))

    return fn


# ------------------------------------------------------------------------------------------------------------
# finish
# ------------------------------------------------------------------------------------------------------------


def finish(r: Run, state: RunState) -> dict:
    """Final evaluation (unless this step was evaluated), checkpoint, pass-rate table, results.json."""
    step = int(state.train.step)
    res = r.results
    if res.get("grpo_eval_step") != step:  # not yet evaluated at this step (or the run was extended)
        res["grpo"] = evaluate(r, state, "after GRPO")
        res["grpo_eval_step"] = step
    _save(r, state)
    stats = jax.device_get(state.rollout.stats)
    table = PassRateTable.from_counts(
        [p.task_id for p in r.rl_problems], stats.attempts, stats.passes, [p.level for p in r.rl_problems]
    )
    rows = table.rows()
    r.logger.table(step, "pass_rates", rows)
    res["train_problems"] = table.summary()
    r.print(
        "training problems: {n_problems_seen} seen, {n_ever_solved} ever solved, mean pass rate "
        "{mean_pass_rate:.3f} (per-problem table: pass_rates.jsonl)".format(**res["train_problems"])
    )
    for row in rows[:3] + rows[-3:] if len(rows) > 6 else rows:
        r.print(
            f"  {row['task_id']:<28} {row['passes']:>4}/{row['attempts']:<4} pass rate {row['pass_rate']:.2f}"
        )
    if r.step_times:
        res["median_step_s_this_process"] = float(np.median(r.step_times))
        # the memory peaks at the last GRPO step, before the final evaluation
        res["memory_grpo_this_process"] = r.memory_after_steps
    res["memory_this_process"] = memory_metrics()  # peaks including SFT and every evaluation
    if r.cfg.checkpoint.export_hf:
        out = os.path.join(r.cfg.workdir, "hf")
        export(r, state, out, overwrite=True)  # the run's own export (an extended run replaces it)
        res["exported_hf"] = out
    res["final_params_sha256"] = params_digest(r.ctx.host(state.train.params))
    res["steps"] = step
    res["wall_seconds_this_process"] = time.perf_counter() - r.t_start
    res["config"] = r.cfg.to_json()
    res["processes"], res["devices"] = r.ctx.count, r.mesh.size
    if r.ctx.is_main:
        write_json_atomic(os.path.join(r.cfg.workdir, "results.json"), res)
    r.print(final_table(res))
    return res


def policy_params(r: Run, state: RunState) -> Any:
    """The full model parameters of the current policy (LoRA adapters folded into the base)."""
    if not r.cfg.lora.enabled:
        return state.train.params
    return lora.fold(state.frozen, state.train.params, alpha=r.cfg.lora.alpha)


def export(r: Run, state: RunState, out: str, overwrite: bool = False) -> None:
    """The current policy as a Hugging Face directory (config.json, model.safetensors, tokenizer files; LoRA
    adapters merged), and for LoRA runs the adapters alone in PEFT's format next to it (`out`_peft)."""
    from grpo_jax.pretrained.api import save_pretrained
    from grpo_jax.pretrained.hf import save_peft_adapters

    params = r.ctx.host(policy_params(r, state))  # every process gathers; process 0 writes
    adapters = r.ctx.host(state.train.params) if r.cfg.lora.enabled else None
    if not r.ctx.is_main:
        return
    model, params = without_value_head(r.model, params)  # PPO's critic is not part of the exported policy
    save_pretrained(out, model, params, tokenizer=r.tok, overwrite=overwrite)
    msg = f"exported the policy (step {int(state.train.step)}) as a Hugging Face checkpoint: {out}"
    if r.cfg.lora.enabled:
        peft = out.rstrip("/") + "_peft"
        save_peft_adapters(peft, r.model, adapters, lora_alpha=r.cfg.lora.alpha, overwrite=overwrite)
        msg += f" (LoRA adapters in PEFT format: {peft})"
    r.print(msg)


def params_digest(params: Any) -> str:
    """SHA-256 over every parameter's bytes (leaf order fixed by the pytree): equal digests = equal bits."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(params)):
        a = np.ascontiguousarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def final_table(results: dict) -> str:
    sft_r, grpo_r = results.get("sft", {}), results.get("grpo", {})
    keys = [k for k in sft_r if k.startswith("pass@") or k.endswith("/pass@1")]  # incl. mbpp/, humaneval/
    before = "after SFT" if "sft_seconds" in results or "sft_from" in results else "before GRPO"
    lines = ["", f"{'held-out metric':<24}{before:>12}{'after GRPO':>12}"]
    for k in keys:
        g = grpo_r.get(k)
        lines.append(f"{k:<24}{sft_r[k]:>12.3f}{(f'{g:.3f}' if g is not None else '-'):>12}")
    return "\n".join(lines)
