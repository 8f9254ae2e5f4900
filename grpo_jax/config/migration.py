"""Saved runs (run.json, a checkpoint's config) against today's config: what a saved config means in today's
terms (migrate_saved: old keys and values), which fields may differ when a run resumes (RESUMABLE_CHANGES,
checked by grpo_jax.train.resume), and which fields decide the post-SFT parameters (SFT_INPUTS,
--sft_from)."""

from __future__ import annotations

import json
from typing import Any

from grpo_jax.config.base import get_path
from grpo_jax.config.run import SUB_SETTINGS, RunConfig
from grpo_jax.config.serialization import _unvalidated, leaves

# fields that may change when a run is resumed (they do not change the trajectory's meaning)
RESUMABLE_CHANGES = (
    "workdir",
    "resume",
    "resume_from",
    "steps",
    "eval.every",
    "checkpoint.every",
    "checkpoint.keep",
    "checkpoint.export_hf",
    "log.every",
    "log.sample_every",
    "sandbox.workers",
    # the mesh and the process layout: the run's meaning is the same on any devices (equal to <= 1e-6,
    # tests/test_distributed.py), so a run may resume on a different machine shape
    "mesh.data",
    "mesh.fsdp",
    "mesh.tensor",
    "mesh.cpu_devices",
    "dist.cluster",
    "dist.coordinator",
    "dist.num_processes",
    "dist.process_id",
    "dist.init_timeout_s",
    "dist.heartbeat_s",
    "dist.step_timeout_s",
    "runtime.compilation_cache",
    # rematerialisation changes what the backward keeps, not the function (float rounding, like the mesh)
    "model.remat",
    # the packed update is the padded one to float rounding; the engines draw from the same distribution
    # (a run resumed on another engine continues with that engine's draws), the slot count and chunk change
    # no token (tests/test_engines.py)
    "optim.pack_tokens",
    "optim.pack_rows_per_doubling",
    "rollout.engine",
    "rollout.engine_slots",
    "rollout.engine_chunk",
    # where the post-SFT parameters were read from (their SFT inputs are checked equal, so the same run)
    "sft.from_workdir",
)


# the fields that decide the post-SFT parameters (loop.warm_start: model init or checkpoint, tokenizer, SFT
# problems and examples, SFT optimiser and steps, the seed's init / sft streams): --sft_from takes another
# run's post-SFT parameters only when all of these are equal (a "prefix." entry covers the whole section)
SFT_INPUTS = (
    "seed",
    "model.",
    "tasks.source",
    "tasks.sft_levels",
    "tasks.train_per_level",
    "tasks.prompt_len",
    "tasks.prompt_format",
    "tasks.chat_instruction",
    "tasks.program_instruction",
    "tasks.system_prompt",
    "sft.steps",
    "sft.batch",
    "sft.lr",
    "sft.warmup_steps",
    "sft.data",
    "sft.bucket",
    # how --sft_data's inputs are read (which problems, their prompts; codeio: the first --codeio_tasks)
    "tasks.data_format",
    "tasks.visible_tests",
    "tasks.max_problems",
    "tasks.difficulty",
    "tasks.codeio_tasks",
    "rollout.max_new_tokens",
)
SFT_INPUTS_EXCLUDED = ("model.logp_chunk",)  # GRPO's chunked head only: SFT computes full logits


def is_sft_input(path: str) -> bool:
    """Whether the dotted config path is one of SFT_INPUTS (a field that decides the post-SFT parameters)."""
    return path not in SFT_INPUTS_EXCLUDED and any(
        path == k or (k.endswith(".") and path.startswith(k)) for k in SFT_INPUTS
    )


# config fields that changed meaning or went away, for runs saved before the change (migrate_saved)
_LEGACY_VALUES = {"model.remat": {False: "none", True: "full"}}  # a bool before the remat policies
_REMOVED = ("mesh.model",)  # the old model-parallel axis (only 1 was ever valid): now mesh.tensor
# sub-settings (SUB_SETTINGS) whose default or preset value changed since runs were saved (issue 23: the
# exploration noise 0.02 -> 0.2; the TRL presets' inert KL / entropy-bonus forms): where their mechanism was
# off in the saved run the value had no effect, so it reads as today's default and the run still resumes
_INERT_WHEN_OFF = ("pool.explore_noise", "objective.loss.kl_bias_correction", "objective.loss.entropy_bonus")


def migrate_saved(flat: dict[str, Any]) -> dict[str, Any]:
    """A saved run's flattened config in today's terms: legacy values mapped, removed fields dropped, fields
    added since filled with their defaults (a run saved before a field existed ran with its default)."""
    out = {k: v for k, v in flat.items() if k not in _REMOVED}
    for k, table in _LEGACY_VALUES.items():
        if k in out and isinstance(out[k], bool):
            out[k] = table[out[k]]
    defaults = json.loads(json.dumps(leaves(RunConfig(workdir="defaults"))))
    for k, v in defaults.items():
        if k not in out:
            out[k] = list(v) if isinstance(v, tuple) else v
    tree = _unvalidated(out, RunConfig)
    for path in _INERT_WHEN_OFF:
        mechanisms = [m for m in SUB_SETTINGS if path in m.paths]
        if not all(m.on(get_path(tree, m.scope) if m.scope else tree) for m in mechanisms):
            out[path] = defaults[path]
    return out
