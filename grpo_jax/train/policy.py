"""A policy to evaluate, loaded as the main job would evaluate it (`experiments.evaluate --checkpoint /
--init_from`; the evaluation itself is grpo_jax.eval.policy_eval):

    loaded = load_policy(o, log)          # o: grpo_jax.eval.inputs.PolicyEval ->
    eval.policy_eval.LoadedPolicy

A checkpoint (WORKDIR[:STEP]): the run's config, tokenizer, model, held-out problems and evaluation stream,
and the trained policy's effective parameters (LoRA / pool / EMA runs: run.param_fn, as the main job's
evaluation takes them). A pretrained model (`init_from`): the main job's defaults for it (chat prompts, 512
new tokens). A path or checkpoint that cannot be read: one EvalInputError naming it.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from grpo_jax import cli
from grpo_jax.codegen.pipeline import PromptFormat
from grpo_jax.eval.inputs import (
    INIT_FROM_DEFAULTS,
    EvalInputError,
    PolicyEval,
    parse_checkpoint,
    resolve_init_from,
)
from grpo_jax.eval.policy_eval import LoadedPolicy
from grpo_jax.runtime import distributed
from grpo_jax.train import build
from grpo_jax.train.export import open_checkpoint, params_digest


def _from_checkpoint(o: PolicyEval, log):
    if not o.checkpoint:
        raise EvalInputError("--checkpoint=WORKDIR[:STEP] is not given")
    workdir, step = parse_checkpoint(o.checkpoint)
    try:
        run, state = open_checkpoint(workdir, step=step, print_fn=log)
    except (ValueError, OSError, KeyError) as e:
        raise EvalInputError(f"--checkpoint={o.checkpoint}: cannot open that checkpoint: {e}") from None
    try:  # the trained policy's effective parameters, as the main job's evaluation takes them
        params = (
            state.train.params if run.param_fn is None else run.param_fn(state.train.params, state.frozen)
        )
        parts = dict(
            tok=run.tok, model=run.model, params=params, host=run.ctx.host, heldout=run.problems.heldout
        )
        parts["run_key"] = (state.train.rng["eval"], int(step))
        return run.cfg, parts, {"checkpoint": os.path.abspath(workdir), "step": int(step)}
    finally:
        run.close()


def _from_pretrained(o: PolicyEval, log):
    if not o.init_from:
        raise EvalInputError("--init_from=PATH|NAME is not given")
    name = resolve_init_from(o.init_from)
    if name != o.init_from:
        log(f"--init_from={o.init_from}: the known checkpoint {name}")
    argv = ["codegen", f"--init_from={name}", f"--workdir={o.out_dir}"]  # (no run: nothing is written)
    if o.prompt_format != "auto":
        argv.append(f"--prompt_format={o.prompt_format}")
    try:
        cfg, _ = cli.resolve(argv)
    except cli.FlagError as e:
        raise EvalInputError(str(e)) from None
    try:
        tok, model, params = build.model_and_tokenizer(cfg, log)
    except (ValueError, OSError, KeyError) as e:
        raise EvalInputError(f"--init_from={o.init_from}: cannot load it: {e}") from None
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, **INIT_FROM_DEFAULTS))
    host = distributed.Context().host
    parts = dict(tok=tok, model=model, params=jax.device_put(params), host=host, heldout=None, run_key=None)
    return cfg, parts, {"init_from": name}


def load_policy(o: PolicyEval, log=print) -> LoadedPolicy:
    """The policy of `o` (a checkpoint or a pretrained model) and how the main job would evaluate it."""
    cfg, parts, info = _from_checkpoint(o, log) if o.checkpoint else _from_pretrained(o, log)
    fmt = cfg.tasks.prompt
    if o.prompt_format != "auto" and o.prompt_format != fmt.kind:
        fmt = PromptFormat(o.prompt_format, fmt.instruction, fmt.system, fmt.program_instruction)
    info["params_sha256"] = params_digest(parts["params"])
    return LoadedPolicy(
        fmt=fmt, rollout=cfg.rollout, eval=cfg.eval, prompt_len=cfg.tasks.prompt_len, info=info, **parts
    )
