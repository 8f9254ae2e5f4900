"""A run's checkpoints as objects, and the policy out of them.

run, state = open_checkpoint(workdir, step=None)   # the Run (no sandbox, no logger) + RunState, to inspect
params = policy_params(run, state)                  # the full model parameters (LoRA folded in)
export(run, state, out_dir)                         # a Hugging Face directory (+ PEFT adapters for LoRA)
params_digest(params)                               # SHA-256 over the parameters' bits
run.close()
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import jax
import numpy as np

from grpo_jax.config import DistConfig, MeshConfig, RunConfig, flat_dict, from_leaves, migrate_saved
from grpo_jax.policies import lora
from grpo_jax.train.build import Run, build, without_value_head
from grpo_jax.train.state import RunState


def config_from_saved(saved: dict, **fields) -> RunConfig:
    """The RunConfig of a run.json / checkpoint `config` (JSON lists back to tuples; fields added since it was
    saved at their defaults, config.migrate_saved), with `fields` (dotted paths) replaced."""

    def tuples(v):
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v

    return from_leaves({**{k: tuples(v) for k, v in migrate_saved(flat_dict(saved)).items()}, **fields})


def open_checkpoint(workdir: str, step: int | None = None, print_fn=print) -> tuple[Run, RunState]:
    """The Run (no sandbox, no logger) and the RunState of a workdir's checkpoint (latest, or `step`), with
    the configuration the run saved, on this process's devices (whatever mesh and processes the run had: the
    checkpoint does not depend on them). Close with `run.close()`."""
    with open(os.path.join(workdir, "run.json"), encoding="utf-8") as f:
        cfg = config_from_saved(json.load(f)["config"], workdir=workdir)
    cfg = dataclasses.replace(cfg, mesh=MeshConfig(), dist=DistConfig())
    run = build(cfg, None, print_fn)
    state, _ = run.ckpt.restore(run.template, step)
    info = run.ckpt.last_restore
    if info is None:
        raise RuntimeError("Checkpointer.restore returned without recording its RestoreInfo")
    skipped = info.line(run.ckpt.directory, doing="reading")
    if skipped is not None:  # corrupt newer steps: said, never silently passed over
        print_fn(skipped)
    run.rollout.bind(state.frozen)
    run.pretrained = None
    return run, state


def policy_params(run: Run, state: RunState) -> Any:
    """The full model parameters of the current policy (LoRA adapters folded into the base)."""
    if not run.cfg.lora.enabled:
        return state.train.params
    return lora.fold(state.frozen, state.train.params, alpha=run.cfg.lora.alpha)


def export(run: Run, state: RunState, out: str, overwrite: bool = False) -> None:
    """The current policy as a Hugging Face directory (config.json, model.safetensors, tokenizer files; LoRA
    adapters merged), and for LoRA runs the adapters alone in PEFT's format next to it (`out`_peft)."""
    from grpo_jax.pretrained.api import save_pretrained
    from grpo_jax.pretrained.hf import save_peft_adapters

    params = run.ctx.host(policy_params(run, state))  # every process gathers; process 0 writes
    adapters = run.ctx.host(state.train.params) if run.cfg.lora.enabled else None
    if not run.ctx.is_main:
        return
    model, params = without_value_head(run.model, params)  # PPO's critic is not part of the exported policy
    save_pretrained(out, model, params, tokenizer=run.tok, overwrite=overwrite)
    msg = f"exported the policy (step {int(state.train.step)}) as a Hugging Face checkpoint: {out}"
    if adapters is not None:  # LoRA runs
        peft = out.rstrip("/") + "_peft"
        save_peft_adapters(peft, run.model, adapters, lora_alpha=run.cfg.lora.alpha, overwrite=overwrite)
        msg += f" (LoRA adapters in PEFT format: {peft})"
    run.print(msg)


def params_digest(params: Any, fetch: Any = jax.device_get) -> str:
    """SHA-256 over every parameter's bytes (leaf order fixed by the pytree): equal digests = equal bits.

    One leaf at a time (`fetch(leaf)` -> numpy: jax.device_get, or a multi-process run's collective
    Context.host), hashed in place: the host holds one leaf's copy at a time, not a second copy of the
    model (+0.54 GB at the end of a SmolLM2 run before)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        a = np.ascontiguousarray(fetch(leaf))
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        # the bytes in C order, as a.tobytes() without the copy; the ignore: numpy's stubs declare
        # ndarray.__buffer__ (the Buffer protocol) for Python >= 3.12 only
        h.update(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    return h.hexdigest()
