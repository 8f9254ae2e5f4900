"""The main job: SFT warm start, then GRPO on sandboxed code rewards.

    python -m experiments.codegen --flagfile=experiments/flagfiles/quickstart.flags
    python -m experiments.codegen --flagfile=experiments/flagfiles/quickstart.flags --preset=dr_grpo \
        --workdir=runs/dr_grpo

Every knob is a flag (see `--helpfull`); flags are parsed once into frozen dataclasses (grpo_jax.config,
grpo_jax.train.loop.CodegenConfig) and validated once. `--preset` fills in the objective of a published recipe
(grpo_jax.core.presets); any objective flag given explicitly overrides the preset. A bad value stops the run
with one line naming the flag and the valid range, before anything is written.

The run resumes from the workdir's latest checkpoint by default (`--noresume` refuses a workdir that has one).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from absl import logging as absl_logging

F = flags
# run
F.DEFINE_string(
    "workdir", None, "Run directory: checkpoints, TensorBoard events, metrics.jsonl, results.json."
)
F.DEFINE_integer("seed", 0, "Seed of the task suite, the model init and every PRNG stream.")
F.DEFINE_bool("resume", True, "Resume from the workdir's latest checkpoint if there is one.")
F.DEFINE_bool(
    "dry_run", False, "Check the flags, print the resolved configuration as JSON and exit (nothing written)."
)
# task suite
F.DEFINE_list("sft_levels", ["0", "1"], "Task levels used for the SFT warm start.")
F.DEFINE_list("rl_levels", ["0", "1"], "Task levels GRPO trains on.")
F.DEFINE_list("eval_levels", ["0", "1"], "Held-out task levels evaluated.")
F.DEFINE_integer("train_per_level", 300, "Training problems per level.")
F.DEFINE_integer("heldout_per_level", 40, "Held-out problems per level.")
F.DEFINE_integer("prompt_len", 64, "Prompt length in tokens (left-padded).")
F.DEFINE_integer("max_new_tokens", 24, "Completion length in tokens (also the SFT target length).")
# model
F.DEFINE_integer("d_model", 128, "Model width.")
F.DEFINE_integer("n_layers", 2, "Transformer layers.")
F.DEFINE_integer("n_heads", 4, "Query heads.")
F.DEFINE_integer("n_kv_heads", 2, "Key/value heads (grouped-query attention).")
F.DEFINE_integer("d_ff", 512, "MLP width.")
F.DEFINE_bool("qkv_bias", True, "Bias on q/k/v projections (Qwen2).")
F.DEFINE_bool("tie_embeddings", True, "Tie the LM head to the embedding.")
F.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16", "float16"], "Compute dtype.")
# SFT
F.DEFINE_integer("sft_steps", 300, "SFT minibatch steps (0 = no warm start).")
F.DEFINE_integer("sft_batch", 32, "SFT batch size.")
F.DEFINE_float("sft_lr", 3e-3, "SFT learning rate.")
# GRPO objective
F.DEFINE_string("preset", None, "Objective preset: deepseekmath, r1, dapo, dr_grpo, gspo, trl_default, seed.")
F.DEFINE_integer("steps", 50, "GRPO steps.")
F.DEFINE_integer("prompts_per_step", 8, "Prompts per GRPO step (B).")
F.DEFINE_integer("group_size", 8, "Completions per prompt (G).")
F.DEFINE_float("learning_rate", 1e-4, "GRPO AdamW learning rate.")
F.DEFINE_integer("warmup_steps", 0, "Linear learning-rate warm-up steps.")
F.DEFINE_float("weight_decay", 0.0, "AdamW weight decay.")
F.DEFINE_float("grad_clip", 1.0, "Global gradient-norm clip.")
F.DEFINE_float("kl_coef", 0.04, "KL coefficient beta (KL to the reference = the SFT policy).")
F.DEFINE_float("entropy_coef", 0.0, "Entropy bonus coefficient.")
F.DEFINE_float("eps_low", 0.2, "Clip range below 1.")
F.DEFINE_float("eps_high", 0.2, "Clip range above 1 (DAPO clip-higher: 0.28).")
F.DEFINE_enum("adv_method", "grpo", ["grpo", "dr_grpo", "rloo", "batch_std"], "Advantage estimator.")
F.DEFINE_integer("adv_ddof", 1, "ddof of the group std (TRL: 1).")
F.DEFINE_float("adv_eps", 1e-4, "eps added to the group std (TRL: 1e-4).")
F.DEFINE_enum(
    "aggregation",
    "seq_mean_token_mean",
    ["seq_mean_token_mean", "token_mean", "constant", "seq_mean"],
    "Loss aggregation (grpo / dapo / dr_grpo / gspo).",
)
F.DEFINE_enum("kl_estimator", "k3", ["k1", "k2", "k3"], "KL estimator.")
F.DEFINE_enum(
    "kl_anchor", "ref", ["ref", "old"], "KL anchor: ref (canonical) or old (the seed document's form)."
)
F.DEFINE_enum("importance_level", "token", ["token", "sequence", "sequence_token"], "Ratio level (GSPO).")
F.DEFINE_enum(
    "controller",
    "constant",
    ["constant", "seed_entropy", "skywork_entropy", "ppo_adaptive_kl", "ziegler_kl"],
    "Adaptive coefficient controller.",
)
F.DEFINE_enum("controller_acts_on", "entropy_coef", ["entropy_coef", "kl_coef"], "Coefficient it drives.")
F.DEFINE_float("controller_target", None, "Controller target (entropy or KL); None = the controller default.")
F.DEFINE_integer("num_iterations", 1, "Optimiser steps per rollout batch (mu).")
F.DEFINE_bool("mask_truncated", False, "Drop completions without EOS from the loss (DAPO overlong filter).")
F.DEFINE_enum(
    "baseline",
    "group",
    ["group", "pool", "mix"],
    "Advantage baseline: group (canonical GRPO), pool (mean reward of the past-policy pool on the same "
    "prompt, scale-only form) or mix (a weighted sum of both). pool/mix need a pool.",
)
F.DEFINE_float("baseline_mix", 0.5, "Weight of the pool baseline in --baseline=mix, in [0, 1].")
F.DEFINE_float("baseline_std_floor", 1.0, "Advantage scale of all-equal groups under a pool baseline.")
F.DEFINE_enum(
    "ref_update", "frozen", ["frozen", "hard", "ema"], "Reference policy updates (needs kl_coef > 0)."
)
F.DEFINE_integer("ref_update_every", 1, "Reference update period in GRPO steps (hard reset or EMA step).")
F.DEFINE_float("ref_ema_tau", 0.005, "EMA rate tau of --ref_update=ema (the seed: 0.005).")
# policy pool (grpo_jax.pool)
F.DEFINE_integer("pool_capacity", 0, "Past-policy pool slots K_max (0 = no pool).")
F.DEFINE_list(
    "pool_k_schedule",
    [],
    "Active pool size by GRPO step, 'step:K,...' starting at 0 (e.g. 0:8,100:16,500:32).",
)
F.DEFINE_integer("pool_push_every", 10, "Push a snapshot of the policy into the pool every N GRPO steps.")
F.DEFINE_integer("pool_eval_members", 0, "Pool members evaluated per step (0 = all slots).")
F.DEFINE_integer("pool_samples_per_member", 1, "Completions per prompt each evaluated member draws.")
F.DEFINE_float("pool_explore_fraction", 0.0, "Fraction of pushes made exploration members (seed: 0.2).")
F.DEFINE_enum(
    "pool_explore_mode", "temperature", ["temperature", "param_noise"], "How exploration members explore."
)
F.DEFINE_float("pool_explore_temperature", 1.5, "Sampling temperature of exploration members.")
F.DEFINE_float("pool_explore_noise", 0.02, "Relative parameter-noise scale of exploration members.")
# LoRA
F.DEFINE_integer("lora_rank", 0, "Train LoRA adapters of this rank, base frozen (0 = full fine-tuning).")
F.DEFINE_float("lora_alpha", 16.0, "LoRA alpha (scale alpha / rank).")
F.DEFINE_list(
    "lora_targets",
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "Projections that get adapters.",
)
# sparse-reward machinery (each off by default; experiments/flagfiles/ablate_*.flags)
F.DEFINE_enum(
    "curriculum",
    "uniform",
    ["uniform", "levels", "pass_rate", "levels+pass_rate"],
    "Problem sampling: uniform, level unlocking by pass-rate thresholds, P(q) ~ max(1 - s(q), floor) "
    "(Kimi k1.5), or both.",
)
F.DEFINE_float("curriculum_ema", 0.9, "EMA factor of the per-problem / per-level pass rates.")
F.DEFINE_float("curriculum_floor", 0.05, "Floor of 1 - s(q) in the pass-rate sampling weights.")
F.DEFINE_integer("curriculum_start_level", 0, "Highest unlocked level at the start (index into --rl_levels).")
F.DEFINE_float("curriculum_promote", 0.6, "Unlock the next level when the top level's pass rate >= this.")
F.DEFINE_float("curriculum_demote", 0.1, "Lock the top level again when its pass rate < this.")
F.DEFINE_integer("curriculum_min_attempts", 32, "Samples on a level before it may be promoted/demoted.")
F.DEFINE_bool("dynamic_sampling", False, "DAPO dynamic sampling: refill groups whose rewards are all equal.")
F.DEFINE_integer("dynamic_max_rounds", 3, "Extra sampling rounds per step for dynamic sampling.")
F.DEFINE_float(
    "replay_fraction", 0.0, "Fraction of prompts whose G-th member is a replayed success (0 = off)."
)
F.DEFINE_integer("replay_capacity", 1024, "Prioritized replay buffer capacity.")
F.DEFINE_float("replay_alpha", 1.0, "Replay priority exponent: (1 - s(q) + 0.01) ** alpha.")
F.DEFINE_float("multiscale_w_tests", 0.0, "Weight of the per-test sub-goal advantage (0 = off).")
F.DEFINE_enum("multiscale_mode", "mean_of_tests", ["mean_of_tests", "fraction"], "Per-test advantage form.")
F.DEFINE_bool("async_rewards", False, "Grade step t+1 in the sandbox while the device trains on step t.")
F.DEFINE_float("tis_cap", 0.0, "Truncated importance-sampling cap C for off-policy data (0 = off).")
F.DEFINE_float("temperature", 1.0, "Sampling temperature for training rollouts.")
F.DEFINE_integer("top_k", 0, "Top-k for training rollouts (0 = off).")
F.DEFINE_float("top_p", 1.0, "Top-p for training rollouts (1 = off).")
# evaluation, checkpoints, logging, sandbox
F.DEFINE_integer(
    "eval_every", 0, "Held-out evaluation every N GRPO steps (0 = after SFT and at the end only)."
)
F.DEFINE_integer("eval_samples", 8, "Samples per held-out problem for pass@k.")
F.DEFINE_list("eval_ks", ["1", "8"], "k values of pass@k.")
F.DEFINE_integer("eval_batch", 16, "Prompts per evaluation sampler call.")
F.DEFINE_integer(
    "checkpoint_every", 25, "Checkpoint every N GRPO steps (also at the end and on SIGTERM/SIGINT)."
)
F.DEFINE_integer("keep_checkpoints", 2, "Checkpoints kept.")
F.DEFINE_integer("log_every", 1, "Console line and histograms every N steps (scalars are logged every step).")
F.DEFINE_integer("sample_log_every", 10, "Log sample completions every N steps (0 = never).")
F.DEFINE_integer("sandbox_workers", 2, "Sandbox worker slots.")
F.DEFINE_float("sandbox_wall_s", 2.0, "Wall-clock limit per program (seconds).")
F.DEFINE_float("sandbox_deadline_s", 120.0, "Deadline for one batch of programs (seconds).")
FLAGS = F.FLAGS

PRESET_FLAGS = (
    "adv_method",
    "adv_ddof",
    "adv_eps",
    "kl_coef",
    "entropy_coef",
    "eps_low",
    "eps_high",
    "aggregation",
    "kl_estimator",
    "kl_anchor",
    "importance_level",
    "group_size",
    "mask_truncated",
    "controller",
    "baseline",
    "ref_update",
    "ref_update_every",
    "ref_ema_tau",
    "pool_capacity",
    "dynamic_sampling",
)


class FlagError(ValueError):
    pass


def _ints(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in FLAGS[name].value)
    except ValueError:
        raise FlagError(  # noqa: B904 - the flag message is the whole story
            f"--{name}={','.join(FLAGS[name].value)}: expected a comma-separated list of integers"
        )


def _check(cond: bool, name: str, why: str) -> None:
    if not cond:
        raise FlagError(f"--{name}={FLAGS[name].value}: {why}")


def pool_k_schedule() -> tuple[tuple[int, int], ...]:
    """--pool_k_schedule 'step:K,...' -> ((step, K), ...)."""
    out = []
    for item in FLAGS.pool_k_schedule:
        try:
            a, b = item.split(":")
            out.append((int(a), int(b)))
        except ValueError:
            raise FlagError(  # noqa: B904
                f"--pool_k_schedule={','.join(FLAGS.pool_k_schedule)}: expected 'step:K,...' pairs of "
                "integers, e.g. 0:8,100:16,500:32"
            )
    return tuple(out)


def check_flags() -> None:
    """Flag checks that need no JAX (so they run before anything starts)."""
    _check(
        FLAGS.workdir is not None and FLAGS.workdir.strip() != "", "workdir", "a run directory is required"
    )
    for name in (
        "train_per_level",
        "heldout_per_level",
        "prompt_len",
        "max_new_tokens",
        "d_model",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "d_ff",
        "sft_batch",
        "prompts_per_step",
        "eval_samples",
        "eval_batch",
        "keep_checkpoints",
        "log_every",
        "sandbox_workers",
    ):
        _check(FLAGS[name].value >= 1, name, "must be >= 1")
    for name in ("sft_steps", "steps", "warmup_steps", "eval_every", "checkpoint_every", "sample_log_every"):
        _check(FLAGS[name].value >= 0, name, "must be >= 0")
    _check(FLAGS.group_size >= 2, "group_size", "must be >= 2 (group-relative advantages need a group)")
    for name in (
        "sft_lr",
        "learning_rate",
        "grad_clip",
        "temperature",
        "sandbox_wall_s",
        "sandbox_deadline_s",
    ):
        _check(FLAGS[name].value > 0, name, "must be > 0")
    for name in ("kl_coef", "entropy_coef", "eps_low", "eps_high", "weight_decay", "adv_eps"):
        _check(FLAGS[name].value >= 0, name, "must be >= 0")
    _check(FLAGS.adv_ddof in (0, 1), "adv_ddof", "must be 0 or 1")
    _check(0 < FLAGS.top_p <= 1, "top_p", "must be in (0, 1]")
    _check(FLAGS.top_k >= 0, "top_k", "must be >= 0")
    _check(FLAGS.num_iterations >= 1, "num_iterations", "must be >= 1")
    _check(FLAGS.d_model % FLAGS.n_heads == 0, "n_heads", f"must divide --d_model={FLAGS.d_model}")
    _check(FLAGS.n_heads % FLAGS.n_kv_heads == 0, "n_kv_heads", f"must divide --n_heads={FLAGS.n_heads}")
    for name in ("sft_levels", "rl_levels", "eval_levels"):
        levels = _ints(name)
        _check(bool(levels) and all(0 <= lv <= 4 for lv in levels), name, "levels must be in 0..4")
    _check(FLAGS.pool_capacity >= 0, "pool_capacity", "must be >= 0 (0 = no pool)")
    _check(FLAGS.lora_rank >= 0, "lora_rank", "must be >= 0 (0 = off)")
    _check(0 <= FLAGS.baseline_mix <= 1, "baseline_mix", "must be in [0, 1]")
    _check(0 < FLAGS.ref_ema_tau <= 1, "ref_ema_tau", "must be in (0, 1]")
    _check(0 <= FLAGS.pool_explore_fraction <= 1, "pool_explore_fraction", "must be in [0, 1]")
    for name in ("ref_update_every", "pool_push_every", "pool_samples_per_member"):
        _check(FLAGS[name].value >= 1, name, "must be >= 1")
    for name in ("baseline_std_floor", "lora_alpha", "pool_explore_temperature"):
        _check(FLAGS[name].value > 0, name, "must be > 0")
    _check(FLAGS.pool_explore_noise >= 0, "pool_explore_noise", "must be >= 0")
    _check(0 <= FLAGS.replay_fraction < 1, "replay_fraction", "must be in [0, 1)")
    _check(FLAGS.tis_cap >= 0, "tis_cap", "must be >= 0 (0 = off)")
    _check(FLAGS.multiscale_w_tests >= 0, "multiscale_w_tests", "must be >= 0 (0 = off)")
    _check(FLAGS.dynamic_max_rounds >= 0, "dynamic_max_rounds", "must be >= 0")
    for name in ("replay_capacity", "curriculum_min_attempts"):
        _check(FLAGS[name].value >= 1, name, "must be >= 1")
    pool_k_schedule()
    ks = _ints("eval_ks")
    _check(all(1 <= k <= FLAGS.eval_samples for k in ks), "eval_ks", "each k in [1, --eval_samples]")


def build_config():
    """Flags -> CodegenConfig (imports JAX-side modules; call after the sandbox has started)."""
    from grpo_jax.config import (
        ControllerConfig,
        LoRAConfig,
        ObjectiveConfig,
        OptimConfig,
        PoolConfig,
        RolloutConfig,
    )
    from grpo_jax.core.losses import GRPOLossConfig
    from grpo_jax.core.presets import PRESET_NAMES, get_preset
    from grpo_jax.curriculum import CurriculumConfig
    from grpo_jax.policies.transformer import TransformerConfig
    from grpo_jax.train.loop import CodegenConfig

    v = {name: FLAGS[name].value for name in PRESET_FLAGS}
    notes = []
    if FLAGS.preset is not None:
        if FLAGS.preset not in PRESET_NAMES:
            raise FlagError(f"--preset={FLAGS.preset}: valid presets are {', '.join(PRESET_NAMES)}")
        p = get_preset(FLAGS.preset)
        from_preset = {
            "adv_method": p.adv_method,
            "adv_ddof": p.adv_ddof,
            "adv_eps": p.adv_eps,
            "kl_coef": p.kl_coef,
            "entropy_coef": p.entropy_coef,
            "eps_low": p.loss.eps_low,
            "eps_high": p.loss.eps_high,
            "aggregation": p.loss.aggregation,
            "kl_estimator": p.loss.kl_estimator,
            "kl_anchor": p.loss.kl_anchor,
            "importance_level": p.loss.importance_level,
            "group_size": p.group_size,
            "mask_truncated": p.mask_truncated,
            "controller": p.entropy_controller or "constant",
            "pool_capacity": p.pool_size,
            "baseline": "pool" if p.pool_size > 0 else "group",
            "dynamic_sampling": p.dynamic_sampling,
        }
        if p.ref_reset_every is not None:
            from_preset.update(ref_update="hard", ref_update_every=p.ref_reset_every)
        if p.ref_ema_tau is not None:
            from_preset.update(ref_update="ema", ref_update_every=1, ref_ema_tau=p.ref_ema_tau)
        for name, value in from_preset.items():
            if not FLAGS[name].present:
                v[name] = value
        missing = [label for label, on in (("overlong reward shaping", p.overlong is not None),) if on]
        if missing:
            notes.append(f"preset {p.name}: not implemented yet, running without: {', '.join(missing)}")
        notes.append(f"preset {p.name}: {p.notes}")
    if v["ref_update"] != "frozen" and v["kl_coef"] == 0 and not FLAGS["ref_update"].present:
        v["ref_update"] = "frozen"  # a preset's reference schedule is moot once --kl_coef=0 removes the KL
    if v["adv_method"] not in ("grpo", "dr_grpo", "rloo", "batch_std"):
        raise FlagError(f"--adv_method={v['adv_method']}: valid: grpo, dr_grpo, rloo, batch_std")
    kw = (("target", FLAGS.controller_target),) if FLAGS.controller_target is not None else ()
    try:
        loss = GRPOLossConfig(
            eps_low=v["eps_low"],
            eps_high=v["eps_high"],
            kl_estimator=v["kl_estimator"],
            kl_anchor=v["kl_anchor"],
            aggregation=v["aggregation"],
            importance_level=v["importance_level"],
            max_len=FLAGS.max_new_tokens if v["aggregation"] == "constant" else None,
            tis_cap=FLAGS.tis_cap if FLAGS.tis_cap > 0 else None,
        )
        objective = ObjectiveConfig(
            adv_method=v["adv_method"],
            adv_ddof=v["adv_ddof"],
            adv_eps=v["adv_eps"],
            loss=loss,
            kl_coef=v["kl_coef"],
            entropy_coef=v["entropy_coef"],
            controller=ControllerConfig(v["controller"], FLAGS.controller_acts_on, kw),
            mask_truncated=v["mask_truncated"],
            num_iterations=FLAGS.num_iterations,
            baseline=v["baseline"],
            baseline_mix=FLAGS.baseline_mix,
            baseline_std_floor=FLAGS.baseline_std_floor,
            ref_update=v["ref_update"],
            ref_update_every=v["ref_update_every"],
            ref_ema_tau=v["ref_ema_tau"],
            multiscale_w_tests=FLAGS.multiscale_w_tests,
            multiscale_mode=FLAGS.multiscale_mode,
        )
        cur_cfg = CurriculumConfig(
            kind=FLAGS.curriculum,
            ema=FLAGS.curriculum_ema,
            floor=FLAGS.curriculum_floor,
            start_level=FLAGS.curriculum_start_level,
            promote=FLAGS.curriculum_promote,
            demote=FLAGS.curriculum_demote,
            min_attempts=FLAGS.curriculum_min_attempts,
        )
        if cur_cfg.start_level >= len(_ints("rl_levels")):
            raise FlagError(
                f"--curriculum_start_level={cur_cfg.start_level}: an index into --rl_levels "
                f"(0..{len(_ints('rl_levels')) - 1})"
            )
        pool_cfg = PoolConfig(
            capacity=v["pool_capacity"],
            k_schedule=pool_k_schedule(),
            push_every=FLAGS.pool_push_every,
            eval_members=FLAGS.pool_eval_members,
            samples_per_member=FLAGS.pool_samples_per_member,
            explore_fraction=FLAGS.pool_explore_fraction,
            explore_mode=FLAGS.pool_explore_mode,
            explore_temperature=FLAGS.pool_explore_temperature,
            explore_noise=FLAGS.pool_explore_noise,
        )
        lora_cfg = LoRAConfig(rank=FLAGS.lora_rank, alpha=FLAGS.lora_alpha, targets=tuple(FLAGS.lora_targets))
        model = TransformerConfig(
            vocab_size=512,
            d_model=FLAGS.d_model,
            n_layers=FLAGS.n_layers,
            n_heads=FLAGS.n_heads,
            n_kv_heads=FLAGS.n_kv_heads,
            d_ff=FLAGS.d_ff,
            qkv_bias=FLAGS.qkv_bias,
            tie_embeddings=FLAGS.tie_embeddings,
            compute_dtype=FLAGS.compute_dtype,
        )
        cfg = CodegenConfig(
            workdir=FLAGS.workdir,
            model=model,
            objective=objective,
            optim=OptimConfig(
                learning_rate=FLAGS.learning_rate,
                weight_decay=FLAGS.weight_decay,
                grad_clip=FLAGS.grad_clip,
                warmup_steps=FLAGS.warmup_steps,
            ),
            rollout=RolloutConfig(
                group_size=v["group_size"],
                max_new_tokens=FLAGS.max_new_tokens,
                temperature=FLAGS.temperature,
                top_k=FLAGS.top_k,
                top_p=FLAGS.top_p,
            ),
            pool=pool_cfg,
            lora=lora_cfg,
            curriculum=cur_cfg,
            dynamic_sampling=v["dynamic_sampling"],
            dynamic_max_rounds=FLAGS.dynamic_max_rounds,
            replay_fraction=FLAGS.replay_fraction,
            replay_capacity=FLAGS.replay_capacity,
            replay_alpha=FLAGS.replay_alpha,
            async_rewards=FLAGS.async_rewards,
            seed=FLAGS.seed,
            sft_levels=_ints("sft_levels"),
            rl_levels=_ints("rl_levels"),
            eval_levels=_ints("eval_levels"),
            train_per_level=FLAGS.train_per_level,
            heldout_per_level=FLAGS.heldout_per_level,
            prompt_len=FLAGS.prompt_len,
            sft_steps=FLAGS.sft_steps,
            sft_batch=FLAGS.sft_batch,
            sft_lr=FLAGS.sft_lr,
            steps=FLAGS.steps,
            prompts_per_step=FLAGS.prompts_per_step,
            eval_every=FLAGS.eval_every,
            eval_samples=FLAGS.eval_samples,
            eval_ks=_ints("eval_ks"),
            eval_batch=FLAGS.eval_batch,
            checkpoint_every=FLAGS.checkpoint_every,
            keep_checkpoints=FLAGS.keep_checkpoints,
            log_every=FLAGS.log_every,
            sample_log_every=FLAGS.sample_log_every,
            sandbox_wall_s=FLAGS.sandbox_wall_s,
            sandbox_deadline_s=FLAGS.sandbox_deadline_s,
            resume=FLAGS.resume,
        )
    except ValueError as e:
        raise FlagError(str(e)) from None
    return cfg, notes


def fail(msg: str) -> None:
    """One line on stderr, exit status 2, nothing written."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def main(argv):
    absl_logging.set_verbosity(absl_logging.WARNING)  # JAX / orbax INFO lines would bury the run's own output
    if len(argv) > 1:
        fail(f"unexpected positional arguments: {' '.join(argv[1:])}")
    try:
        check_flags()
    except FlagError as e:
        fail(str(e))
    if FLAGS.dry_run:
        try:
            cfg, notes = build_config()
        except FlagError as e:
            fail(str(e))
        import json

        for n in notes:
            print(n, file=sys.stderr)
        print(json.dumps(cfg.to_json(), indent=1))
        return
    from grpo_jax.sandbox.executor import Executor
    from grpo_jax.sandbox.types import Limits

    # the sandbox workers start before JAX is imported
    limits = Limits(wall_s=FLAGS.sandbox_wall_s, cpu_s=max(1, int(FLAGS.sandbox_wall_s + 0.999)))
    with Executor(num_workers=FLAGS.sandbox_workers, limits=limits) as executor:
        print(f"sandbox: {FLAGS.sandbox_workers} workers, isolation tier {executor.tier}", flush=True)
        try:
            cfg, notes = build_config()
        except FlagError as e:
            fail(str(e))
        for n in notes:
            print(n, flush=True)
        from grpo_jax.train.loop import RunConfigError, run

        try:
            run(cfg, executor)
        except RunConfigError as e:  # e.g. the workdir holds a different run
            fail(str(e))


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with a one-line error (missing or garbled flagfile, bad type, unknown flag)."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        fail(str(e).replace("ERROR:: ", ""))
    except UnicodeDecodeError as e:  # a flagfile that is not text
        fail(f"a --flagfile is not valid UTF-8 text ({e.reason} at byte {e.start})")
    raise AssertionError("unreachable")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(main, flags_parser=parse_flags)
