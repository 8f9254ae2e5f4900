"""The assembly of a run: everything a process builds once, before any state exists.

    run = build(cfg, executor)        # problems, tokenizer, model, optimizer, checkpointer, mesh, rollout,
                                      # the compiled train step, the RunState's template and shardings
    state = placed_state(run, params) # the RunState that starts from `params`, in the run's shardings

The phases that use it are grpo_jax.train.loop (set-up / resume, warm start, RL steps, evaluation, finish).
In a multi-process run every process builds the same; only process 0 prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from grpo_jax import rng as rng_lib
from grpo_jax.config import RunConfig
from grpo_jax.data.problems import Problems, load_problems
from grpo_jax.errors import RunConfigError
from grpo_jax.policies import lora, sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.rewards import registry as rewards_registry
from grpo_jax.rollout.codegen import make_rollout
from grpo_jax.rollout.engines import make_engine
from grpo_jax.runtime import distributed, sharding
from grpo_jax.sandbox.executor import Executor
from grpo_jax.tokenization import CodeTokenizer, Tokenizer, stop_ids
from grpo_jax.train import workdir as workdir_lib
from grpo_jax.train.checkpoint import Checkpointer
from grpo_jax.train.logging import MetricsLogger
from grpo_jax.train.state import RunState, init_state, make_optimizer
from grpo_jax.train.step import make_train_step


@dataclasses.dataclass
class Run:
    """Everything one process builds once for a run (host objects; the RunState is separate), made by `build`,
    plus what the phases record as the run goes (`results`, `logger`, step times, memory peaks)."""

    cfg: RunConfig
    ctx: distributed.Context
    mesh: Any
    print: Callable[[str], None]
    notes: tuple[str, ...]
    executor: Executor | None
    tok: Tokenizer
    model: tfm.TransformerConfig
    problems: Problems
    optimizer: Any
    param_fn: Callable | None  # trainable + frozen -> the model's parameters (LoRA), None: the identity
    ckpt: Checkpointer
    rollout: Any
    train_step: Callable
    template: Any  # the RunState's shapes, dtypes and shardings (the restore template)
    state_sh: Any  # the same shardings alone (jit in/out shardings)
    pretrained: Any = None  # the checkpoint's parameters (init_from), consumed by the warm start
    logger: MetricsLogger | Any = None
    results: dict = dataclasses.field(default_factory=dict)
    t_start: float = dataclasses.field(default_factory=time.perf_counter)
    step_times: list = dataclasses.field(default_factory=list)
    memory_after_steps: dict = dataclasses.field(default_factory=dict)  # memory_metrics() at the last step
    eval_engine: Any = None  # the held-out evaluation's rollout engine (the policy's own weights dtype)
    workdir_lock: Any = None  # process 0's lock on the workdir (grpo_jax.train.workdir), None: a reader

    def close(self) -> None:
        try:
            self.rollout.close()
            self.ckpt.close()
            if self.logger is not None:
                self.logger.close()
        finally:
            if self.workdir_lock is not None:  # last: the workdir is the next run's once this run is done
                self.workdir_lock.release()


def build(cfg: RunConfig, executor: Executor | None, print_fn=print, notes=()) -> Run:
    """The Run of `cfg` (no state). `executor`: the sandbox (None: a run that only opens checkpoints)."""
    ctx = distributed.context(cfg.dist)
    print_fn = ctx.print_fn(print_fn)
    rewards_registry.from_config(cfg)  # an unusable --rewards function: an error before the workdir
    mesh = run_mesh(cfg, ctx, print_fn)
    problems = load_problems(cfg, executor, print_fn)
    tok, model, pretrained = model_and_tokenizer(cfg, print_fn)
    problems = fit_prompts(cfg, tok, problems, print_fn)
    check_chat_template(cfg, tok, problems)
    check_feedback_budget(cfg, tok, problems)
    if executor is not None and cfg.sandbox.time_limits == "reference":
        problems = reference_limits(cfg, executor, problems, print_fn, ctx)
    print_fn(tasks_line(cfg, problems, executor))
    param_fn = None
    if cfg.lora.enabled:

        def param_fn(adapters, base):
            return lora.merge(jax.lax.stop_gradient(base), adapters, alpha=cfg.lora.alpha)

    optimizer = make_optimizer(cfg.optim)
    os.makedirs(cfg.workdir, exist_ok=True)
    held = hold_workdir(cfg, ctx, executor)  # before anything is written there
    try:
        ckpt = Checkpointer(  # no executor: a run that only opens checkpoints, maybe of a run still saving
            os.path.join(os.path.abspath(cfg.workdir), "checkpoints"),
            keep=cfg.checkpoint.keep,
            read_only=executor is None,
        )
        batch_sh = sharding.batch_sharding(mesh)
        rollout = make_rollout(
            cfg, tok, executor, problems.rl, model, param_fn, ctx=ctx, batch_sharding=batch_sh
        )
        template = state_template(cfg, model, optimizer, rollout, mesh)
        state_sh = jax.tree.map(lambda a: a.sharding, template)
        train_step = make_train_step(
            model,
            cfg.objective,
            optimizer,
            temperature=cfg.rollout.temperature,
            param_fn=param_fn,
            shardings=(state_sh.train, batch_sh, state_sh.frozen),
            micro_batches=cfg.optim.micro_batches,
            pack_tokens=cfg.optim.pack_tokens,
            pad_id=tok.pad_id,
            pack_rows_per_doubling=cfg.optim.pack_rows_per_doubling,
        )
        return Run(
            eval_engine=eval_engine(cfg, model, tok),
            cfg=cfg,
            ctx=ctx,
            mesh=mesh,
            print=print_fn,
            notes=tuple(notes),
            executor=executor,
            tok=tok,
            model=model,
            problems=problems,
            optimizer=optimizer,
            param_fn=param_fn,
            ckpt=ckpt,
            rollout=rollout,
            train_step=train_step,
            template=template,
            state_sh=state_sh,
            pretrained=pretrained,
            workdir_lock=held,
        )
    except BaseException:
        if held is not None:
            held.release()
        raise


def eval_engine(cfg: RunConfig, model: tfm.TransformerConfig, tok):
    """The held-out evaluation's rollout engine: --rollout_engine's kind, sampling the policy as it is (a
    bfloat16 policy from its bf16 weight copy; sampling.policy_weights_dtype), never in --rollout_dtype."""
    ro = cfg.rollout
    return make_engine(
        ro.engine,
        model,
        max_new=ro.max_new_tokens,
        eos_ids=stop_ids(tok),
        pad_id=tok.pad_id,
        weights_dtype=sampling.policy_weights_dtype(model),
        slots=ro.engine_slots,
        chunk=ro.engine_chunk,
    )


def hold_workdir(cfg: RunConfig, ctx: distributed.Context, executor: Executor | None):
    """One run per workdir: process 0 of a run that trains takes the workdir's lock (grpo_jax.train.workdir),
    held until Run.close() or the process ends; every process raises the same RunConfigError when another run
    holds it. A run that only reads the workdir (no executor: the evaluator, export) takes none."""
    if executor is None:
        return None
    held = {}

    def take():
        try:
            held["lock"] = workdir_lib.lock(cfg.workdir)
        except workdir_lib.WorkdirBusy as e:
            return str(e)
        return None

    refused = ctx.broadcast_object("workdir_lock", take)
    if refused:
        raise RunConfigError(refused)
    return held.get("lock")


def tasks_line(cfg: RunConfig, p: Problems, executor: Executor | None) -> str:
    t = cfg.tasks
    what = {
        "procedural": f"levels {t.sft_levels} / {t.rl_levels}",
        "mbpp": "MBPP train split",
        "codeio": "CodeI/O train split",
        "mbpp+codeio": "MBPP + CodeI/O train splits",
    }.get(t.source, t.train_data)
    engine = cfg.rollout.engine
    if engine == "continuous":
        engine += f" ({cfg.rollout.engine_slots} slots"
        engine += "; pool members: the static engine)" if cfg.pool.enabled else ")"
    return (
        f"tasks: {len(p.sft)} SFT{f' ({cfg.sft.data})' if cfg.sft.data else ''} / {len(p.rl)} RL training "
        f"problems ({what}), {len(p.heldout)} held-out"
        f"{''.join(f', {len(v)} {k}' for k, v in p.extra.items())}; prompts {t.prompt_format}; "
        f"{engine} rollout engine" + (f"; sandbox tier {executor.tier}" if executor is not None else "")
    )


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


def fit_prompts(cfg: RunConfig, tok, p: Problems, print_fn=print) -> Problems:
    """Problems of a dataset (--source=file|codeio|mbpp, --eval_data, --sft_data) whose prompt is longer than
    --prompt_len tokens are left out before anything runs, with a count (the datasets' statements run to
    thousands of tokens: MBPP's test split up to 3 757 in SmolLM2's chat template); so are SFT problems whose
    reference (+ EOS) is longer than --max_new_tokens; the procedural suite's short prompts keep
    pipeline.encode_prompts' error."""
    from grpo_jax.codegen.pipeline import render_prompt, sft_target

    t = cfg.tasks
    fmt = t.prompt

    def fit(name, problems, length, what, flag, limit, fix):
        kept = [q for q in problems if length(q) <= limit]
        too_long = f"longer than {flag}={limit} tokens"
        if len(kept) < len(problems):
            print_fn(
                f"{name}: {len(problems) - len(kept)} of {len(problems)} {what} are {too_long} and left out"
            )
        if not kept:
            raise RunConfigError(f"{name}: all {len(problems)} {what} are {too_long}: {fix}")
        return kept

    def prompts(name, problems):
        length = lambda q: len(tok.encode(render_prompt(tok, q, fmt)))  # noqa: E731
        return fit(name, problems, length, "prompts", "--prompt_len", t.prompt_len, "raise --prompt_len")

    sft, rl, heldout = p.sft, p.rl, p.heldout
    dataset = t.source in ("file", "codeio", "mbpp", "mbpp+codeio")
    if dataset:
        rl = prompts("training problems", rl)
        if len(rl) < cfg.rollout.prompts_per_step:
            raise RunConfigError(
                f"--prompts_per_step={cfg.rollout.prompts_per_step} is more than the {len(rl)} training "
                "problems that fit"
            )
        if not cfg.sft.data:  # the source's SFT problems: its training problems whose prompts fit
            keep = {q.task_id for q in rl}
            sft = [q for q in sft if q.task_id in keep]
    if cfg.sft.data:  # --sft_data's own problems (any source): their prompts must fit too
        sft = prompts("SFT (--sft_data)", sft)
    if cfg.sft.steps and (dataset or cfg.sft.data):
        # the warm start's targets (reference + EOS) must fit in the completion length
        length = lambda q: len(tok.encode(sft_target(q, fmt))) + 1  # noqa: E731
        what, n = "reference solutions (with EOS)", cfg.rollout.max_new_tokens
        sft = fit("SFT", sft, length, what, "--max_new_tokens", n, "raise it, or --sft_steps=0")
    if t.eval_data or dataset:
        heldout = prompts("held-out problems", heldout)
    return Problems(sft, rl, heldout, p.extra)


def check_feedback_budget(cfg: RunConfig, tok, p: Problems) -> None:
    """Multi-turn runs: every feedback turn fits --feedback_tokens with an empty message (the training
    problems with --max_turns > 1, the evaluation sets with its turns > 1), or RunConfigError before anything
    is written (feedback.check_feedback_budget; it would otherwise fail at the first failed reply)."""
    from grpo_jax.codegen import feedback

    ro = cfg.rollout
    sets = [p.rl] if ro.max_turns > 1 else []
    if (cfg.eval.max_turns or ro.max_turns) > 1:
        sets += [p.heldout, *p.extra.values()]
    try:
        for problems in sets:
            feedback.check_feedback_budget(tok, cfg.tasks.prompt, problems, ro.feedback_tokens)
    except ValueError as e:
        raise RunConfigError(str(e)) from None


def check_chat_template(cfg: RunConfig, tok, p: Problems) -> None:
    """Chat prompts: the tokenizer's chat template renders the first training prompt, or RunConfigError
    naming the tokenizer (a template that compiles but fails on a prompt, or none at all), before anything
    is written (the first render is otherwise the evaluation after the warm start)."""
    if cfg.tasks.prompt.kind != "chat" or not p.rl:
        return
    import jinja2

    from grpo_jax.codegen.pipeline import render_prompt

    source = tokenizer_flag(cfg) or "the procedural tokenizer"
    try:
        render_prompt(tok, p.rl[0], cfg.tasks.prompt)
    except (ValueError, TypeError, jinja2.TemplateError) as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        raise RunConfigError(
            f"--prompt_format=chat: the chat template of {source} does not render a prompt "
            f"({type(e).__name__}: {msg})"
        ) from None


def reference_limits(cfg: RunConfig, executor: Executor, p: Problems, print_fn, ctx=None) -> Problems:
    """Every graded problem with its own wall limit from its reference's measured time (cached on disk).
    Several processes: process 0 measures and sends the limits to the others, so every sandbox grades
    with the same limits."""
    from grpo_jax.codegen.timelimits import with_reference_time_limits

    kw = dict(floor_s=cfg.sandbox.time_limit_floor_s, factor=cfg.sandbox.time_limit_factor)
    groups = [p.rl, p.heldout, *p.extra.values()]
    problems = [q for g in groups for q in g]

    def measure():
        flat, report = with_reference_time_limits(executor, problems, **kw)
        return [q.time_limit_s for q in flat], report

    limits, rep = (ctx or distributed.Context()).broadcast_object("time_limits", measure)
    flat = [dataclasses.replace(q, time_limit_s=t) for q, t in zip(problems, limits, strict=True)]
    out, i = [], 0
    for g in groups:
        out.append(flat[i : i + len(g)])
        i += len(g)
    print_fn(
        f"time limits: per problem {rep['min_s']:.2f}–{rep['max_s']:.2f} s (median {rep['median_s']:.2f}; "
        f"{rep['measured']} references measured, {rep['cached']} cached, {rep['failed_reference']} "
        f"without a passing reference keep {rep['cap_s']} s)"
    )
    return Problems(p.sft, out[0], out[1], dict(zip(p.extra, out[2:], strict=True)))


def tokenizer_flag(cfg: RunConfig) -> str | None:
    """The flag whose file the run's tokenizer comes from (--tokenizer, else --init_from), or None."""
    m = cfg.model
    return (
        f"--tokenizer={m.tokenizer}" if m.tokenizer else f"--init_from={m.init_from}" if m.init_from else None
    )


@contextlib.contextmanager
def input_file(flag: str):
    """Loading the file(s) of `flag`: the loaders' errors for a bad file (ValueError / OSError naming the
    file and what is valid: truncated, garbled, not JSON, the wrong dtype or shape, a missing shard) become
    one RunConfigError "--flag=value: <what is wrong>", raised before anything is written to the workdir."""
    try:
        yield
    except (OSError, ValueError) as e:
        msg = " ".join(str(e).split()) or type(e).__name__  # one line
        raise RunConfigError(f"{flag}: {msg}") from None


def model_and_tokenizer(cfg: RunConfig, print_fn=print):
    """(tokenizer, TransformerConfig, pretrained params or None): the checkpoint of --init_from with its own
    tokenizer, or a fresh model of cfg.model's shape over the procedural tokenizer (or --tokenizer)."""
    m = cfg.model
    tok = CodeTokenizer()
    flag = tokenizer_flag(cfg)
    if flag is not None:  # --tokenizer or --init_from
        from grpo_jax.pretrained.api import load_tokenizer

        with input_file(flag):
            tok = load_tokenizer(m.tokenizer or m.init_from)
    if not m.init_from:
        return tok, model_config(cfg, tok), None
    from grpo_jax.pretrained.api import load_pretrained

    t0 = time.perf_counter()
    with input_file(f"--init_from={m.init_from}"):
        model, params = load_pretrained(m.init_from)
    model = dataclasses.replace(
        model,
        compute_dtype=m.compute_dtype,
        remat=m.remat,
        logp_chunk=m.logp_chunk,
        value_head=cfg.objective.algorithm == "ppo",
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
        logp_chunk=m.logp_chunk,
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


def fresh_state(cfg: RunConfig, optimizer, rollout, params: Any) -> RunState:
    """The RunState that starts from `params` (the SFT policy): LoRA adapters (B = 0) over the frozen base
    when LoRA is on, the rollout's state (pool shaped like the trainable parameters, curriculum, ...)."""
    frozen = None
    if cfg.lora.enabled:
        key = rng_lib.derive(rng_lib.streams(cfg.seed)["init"], "lora")
        frozen, params = params, lora.init(params, key, rank=cfg.lora.rank, targets=cfg.lora.targets)
    train = init_state(params, cfg.objective, optimizer, seed=cfg.seed)
    return RunState(train=train, rollout=rollout.init_state(params), frozen=frozen)


def state_template(cfg: RunConfig, model, optimizer, rollout, mesh) -> RunState:
    """The RunState's shapes and dtypes with its shardings (traced once per run; the restore template):
    train state and LoRA base by parameter specs (sharding.tree_shardings), the pool's members split over
    data (sharding.pool_shardings), the rest of the rollout state (curriculum, replay, pending batch, pool
    bookkeeping) replicated."""
    init = lambda: fresh_state(cfg, optimizer, rollout, tfm.init_params(model, jax.random.PRNGKey(0)))
    abstract = jax.eval_shape(init)
    rep = sharding.replicated(mesh)
    shard_rollout = jax.tree.map(lambda _: rep, abstract.rollout)
    if abstract.rollout.pool is not None:  # the pool's K snapshots split over the data axis
        shard_rollout = dataclasses.replace(
            shard_rollout, pool=sharding.pool_shardings(abstract.rollout.pool, mesh)
        )
    shardings = RunState(
        train=sharding.tree_shardings(abstract.train, mesh),
        rollout=shard_rollout,
        frozen=sharding.tree_shardings(abstract.frozen, mesh),
    )
    return jax.tree.map(
        lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), abstract, shardings
    )


def placed_state(run: Run, params: Any) -> RunState:
    """fresh_state(...) of `params` built straight into the run's shardings: the (host or local) parameters
    are placed by their specs first, so a checkpoint's weights and the optimizer moments never sit whole on
    one device."""
    params = sharding.put(params, sharding.tree_shardings(params, run.mesh))
    fresh = lambda p: fresh_state(run.cfg, run.optimizer, run.rollout, p)
    return jax.jit(fresh, out_shardings=run.state_sh)(params)
