"""Checkpoints of the main job: save, resume (the same run only), and warm starts from another run's post-SFT
checkpoint (--sft_from).

    save(run, state, step)               # RunState + host JSON (results, the rollout's host part, the config)
    state = restore(run)                 # the workdir's newest intact checkpoint (or --resume_from's), or
                                         # None; refuses another run; skips corrupt steps, saying so
    check_sft_source(cfg)                # --sft_from names a compatible warm start (one error line if not)
    params = sft_params_from(run)        # its post-SFT parameters, as this run's own init would have them
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax

from grpo_jax.config import RESUMABLE_CHANGES, RunConfig, flat_dict, is_sft_input, migrate_saved
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.build import Run, RunConfigError, with_value_head
from grpo_jax.train.checkpoint import CheckpointCorruptError, CheckpointMismatchError
from grpo_jax.train.export import open_checkpoint
from grpo_jax.train.state import RunState


def save(run: Run, state: RunState, step: int) -> None:
    """Checkpoint `state` as step `step` (the host's step counter) with the host JSON."""
    host = {"config": run.cfg.to_json(), "results": run.results, "rollout": run.rollout.host_state()}
    run.ckpt.save(step, state, host, force=True)


def restore(run: Run) -> tuple[RunState, int] | tuple[None, int]:
    """(state, step) of the workdir's newest intact checkpoint (--resume_from: that step), or (None, 0) when
    there is none. Corrupt newer steps (files that differ from the checksums recorded when they were saved)
    are skipped with one line, and recorded in the results (resumed_from_step, skipped_corrupt_steps); a
    corrupt or missing --resume_from step, or no intact step, is a RunConfigError (nothing is deleted)."""
    latest = run.ckpt.latest_step()
    if latest is None:
        return None, 0
    if not run.cfg.resume:
        raise RunConfigError(
            f"workdir {run.cfg.workdir} already holds checkpoints (latest step {latest}) and resume is off: "
            "use a new --workdir, or drop --noresume to continue that run"
        )
    asked = run.cfg.resume_from
    try:
        state, host = run.ckpt.restore(run.template, asked)
    except CheckpointMismatchError as e:
        raise RunConfigError(
            f"the workdir {run.cfg.workdir} holds a run with a different model: {e}"
        ) from None
    except (CheckpointCorruptError, FileNotFoundError) as e:
        raise RunConfigError(f"{f'--resume_from={asked}: ' if asked is not None else ''}{e}") from None
    info = run.ckpt.last_restore
    if info is None:
        raise RuntimeError("Checkpointer.restore returned without recording its RestoreInfo")
    skipped = info.line(run.ckpt.directory)
    if skipped is not None:
        run.print(skipped)
    check_resumable(run.cfg, host["config"])
    run.results = host["results"]
    run.results["resumed_from_step"] = info.step
    run.results["skipped_corrupt_steps"] = [s for s, _ in info.skipped]
    run.rollout.load_host_state(host.get("rollout", {}))
    run.rollout.bind(state.frozen)
    step = int(state.train.step)  # the one device read of the step counter
    run.print(f"resumed from {run.ckpt.directory} at GRPO step {step}")
    return state, step


def check_resumable(cfg: RunConfig, saved: dict) -> None:
    """The saved run equals this one in every field but RESUMABLE_CHANGES; else RunConfigError naming them."""
    now, old = flat_dict(cfg.to_json()), migrate_saved(flat_dict(saved))
    diff = sorted(k for k in set(now) | set(old) if k not in RESUMABLE_CHANGES and now.get(k) != old.get(k))
    if diff:
        raise RunConfigError(
            f"the workdir {cfg.workdir} holds a run with a different configuration ({', '.join(diff)}); "
            "use a new --workdir or --noresume"
        )


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


def sft_params_from(run: Run):
    """The post-SFT parameters of --sft_from's step-0 checkpoint (the LoRA base if that run had LoRA), as
    host arrays of the same tree as this run's own init."""
    src, t = run.cfg.sft.from_workdir, time.perf_counter()
    run.pretrained = None
    other, state = open_checkpoint(src, step=0, print_fn=lambda _: None)
    try:
        params = jax.device_get(state.frozen if other.cfg.lora.enabled else state.train.params)
    finally:
        other.close()
    # the policy is what SFT made: a PPO source's value head (zero, SFT never trains it) is dropped, and this
    # run's own (zero) head is added when it is PPO, so GRPO and PPO arms share one warm start
    params = {k: v for k, v in params.items() if k != "value_head"}
    policy = dataclasses.replace(run.model, value_head=False)
    want = jax.eval_shape(lambda: tfm.init_params(policy, jax.random.PRNGKey(0)))
    spec = lambda tree: (jax.tree.structure(tree), [(x.shape, x.dtype) for x in jax.tree.leaves(tree)])
    if spec(params) != spec(want):
        raise RunConfigError(f"--sft_from={src}: its parameters are not of this run's model (tree or shapes)")
    params = with_value_head(params, run.model)
    run.results["sft_from"] = src
    try:
        with open(os.path.join(src, "results.json"), encoding="utf-8") as f:
            run.results["sft_final_loss"] = json.load(f)["sft_final_loss"]
    except (OSError, ValueError, KeyError):
        pass
    run.print(
        f"warm start: the post-SFT parameters of {src} (its step-0 checkpoint; SFT not repeated; "
        f"{time.perf_counter() - t:.1f} s)"
    )
    return params
