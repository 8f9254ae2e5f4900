"""The ONE configuration of a run: a tree of frozen, validated dataclasses (ARCHITECTURE.md §3 rule 9).

    RunConfig
      model       ModelConfig        the transformer's shape (the vocabulary comes from the tokenizer)
      tasks       TaskConfig         which levels of the procedural suite train / evaluate, prompt length
      sft         SFTConfig          the supervised warm start
      objective   ObjectiveConfig    the algorithm (grpo | ppo), advantages, baseline, KL, entropy, reference
                                     updates, reward shaping
        loss        PolicyLossConfig clipping, KL estimator/anchor, aggregation, TIS (every algorithm's loss)
        controller  ControllerConfig adaptive entropy / KL coefficient
        ppo         PPOConfig        --algorithm=ppo: GAE, the critic's value loss, whitening, the reward's KL
      optim       OptimConfig        AdamW
      rollout     RolloutConfig      B, G, sampling, dynamic sampling, async rewards
      pool        PoolConfig         the seed's pool of past policies
      lora        LoRAConfig         adapters-only training
      replay      ReplayConfig       prioritized replay of successes
      curriculum  CurriculumConfig   problem sampling by level / pass rate
      eval        EvalConfig         held-out pass@k
      sandbox     SandboxConfig      the code executor's workers and limits
      checkpoint  CheckpointConfig   orbax checkpoints
      log         LogConfig          console / TensorBoard / JSONL cadence
      mesh        MeshConfig         the device mesh: data x fsdp x tensor
      dist        DistConfig         multi-process / multi-host (jax.distributed)
      runtime     RuntimeConfig      how this process runs (the persistent compilation cache)

Every field is checked once, in the `__post_init__` of the class that owns it (cross-section rules in
`RunConfig.__post_init__`), and a bad value raises grpo_jax.errors.ConfigError naming the field, the value and
what is valid. The command line is DERIVED from this tree (grpo_jax.cli): each leaf field is one flag, named
`FLAG_PREFIX + field` unless its metadata names the flag, with the field's `help` metadata as its help text;
so a flag's default, type, meaning and check are written once, here. Everything in the tree is hashable (a
static jit argument); numbers that change during training (coefficients, the schedule position) are arrays
in the TrainState.

Derived quantities are computed in one place, `RunConfig._derive` (the loss's max_len = max_new_tokens, and
the defaults that depend on the model, AUTO_DEFAULTS: a pretrained --init_from model gets no SFT and chat
prompts unless told otherwise). A setting of an optional mechanism that is off (SUB_SETTINGS: --pool_capacity
without a pool baseline, --ppo_* without --algorithm=ppo, ...) is refused by one rule, `_check_sub_settings`.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import typing
from collections.abc import Callable
from typing import Any, ClassVar

from grpo_jax.codegen.pipeline import DEFAULT_INSTRUCTION, PROGRAM_INSTRUCTION, PromptFormat
from grpo_jax.codegen.tasks import LEVELS
from grpo_jax.core.advantages import GROUP_ADV_METHODS
from grpo_jax.core.aggregation import AGGREGATIONS
from grpo_jax.core.controllers import CONTROLLER_KINDS, KL_CONTROLLERS
from grpo_jax.core.kl import KL_ANCHORS, KL_KINDS
from grpo_jax.core.surrogates import DPPO_DIVERGENCES, IMPORTANCE_LEVELS, OBJECTIVES, TIS_LEVELS, TIS_MODES
from grpo_jax.data import registry as data_registry
from grpo_jax.errors import fail
from grpo_jax.policies.continuous import ROLLOUT_ENGINES
from grpo_jax.policies.lora import TARGETS as LORA_TARGETS
from grpo_jax.policies.sampling import ROLLOUT_DTYPES
from grpo_jax.policies.transformer import REMAT_POLICIES
from grpo_jax.pretrained.api import resolve as resolve_checkpoint

ALGORITHMS = ("grpo", "ppo", "dppo")  # grpo_jax.algorithms.ALGORITHMS: one factory each
BASELINES = ("group", "pool", "mix")
REF_UPDATES = ("frozen", "hard", "ema")
EXPLORE_MODES = ("temperature", "param_noise")
MULTISCALE_MODES = ("mean_of_tests", "fraction")
CURRICULUM_KINDS = ("uniform", "levels", "pass_rate", "levels+pass_rate")
DTYPES = ("float32", "bfloat16", "float16")
TASK_SOURCES = ("procedural", "mbpp", "codeio", "file")
# problem-file formats (the registry of grpo_jax.data: every format, then the aliases), and which tests grade
DATA_FORMATS = ("auto", *data_registry.names())
GRADE_TESTS = ("all", "private")
PROMPT_FORMATS = ("plain", "chat")
# defaults that depend on the model, resolved by RunConfig._derive (an explicit value always wins): {path:
# (the value for a model trained from scratch, the value for a pretrained --init_from model)}. Unresolved,
# the field holds None (sft.steps) or "auto" (tasks.prompt_format); a built RunConfig never does, so a config
# derived from a built one (dataclasses.replace, from_leaves of its leaves) keeps the resolved values: give
# these fields again when changing init_from that way.
AUTO_DEFAULTS = {"sft.steps": (300, 0), "tasks.prompt_format": ("plain", "chat")}
# multiplicative controllers: a coefficient that starts at 0 stays 0
_MULTIPLICATIVE = ("seed_entropy", "ppo_adaptive_kl", "ziegler_kl")
# which optional controller parameters each kind takes (grpo_jax.core.controllers factories)
CONTROLLER_PARAMS = {
    "constant": (),
    "seed_entropy": ("target", "low", "high", "up", "down", "min_coef", "max_coef"),
    "skywork_entropy": ("target", "delta", "min_coef", "max_coef"),
    "ppo_adaptive_kl": ("target",),
    "ziegler_kl": ("target", "horizon"),
}


def opt(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple | None = None,
    none_word: str | None = None,
) -> Any:
    """A config field with its command-line help (and flag name when it is not FLAG_PREFIX + name).
    none_word: for an optional field, the one word the command line reads as None (default: none / off)."""
    meta: dict[str, Any] = {"help": help}
    if flag is not None:
        meta["flag"] = flag
    if choices is not None:
        meta["choices"] = choices
    if none_word is not None:
        meta["none_word"] = none_word
    return dataclasses.field(default=default, metadata=meta)


def _positive(obj, names, strict=True):
    for n in names:
        v = getattr(obj, n)
        if (strict and not v > 0) or (not strict and not v >= 0):
            fail(obj, n, "must be > 0" if strict else "must be >= 0")


def _choice(obj, name, valid):
    if getattr(obj, name) not in valid:
        fail(obj, name, f"valid: {', '.join(valid)}")


def _schedule_ok(obj, name, what):
    sched = getattr(obj, name)
    steps = [s for s, _ in sched]
    if sched and (steps[0] != 0 or steps != sorted(set(steps))):
        fail(obj, name, f"steps must start at 0 and increase strictly, e.g. {what}")


def get_path(cfg: Any, path: str) -> Any:
    """The value at dotted `path` below a config object."""
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


# ------------------------------------------------------------------------------------------------------------
# sub-settings of optional mechanisms: ONE rule (issue 23)
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """An optional mechanism of a run and the fields that only matter while it is on.

    The rule: a field of `fields` that differs from its default while `on` is false is refused (ConfigError
    naming the field: "only used with {needs} ({what}); this run has {state}: {fix}"). A value equal to
    the default is never refused, so a preset or a flagfile that leaves a field alone never trips it. A field
    may be a sub-setting of several mechanisms (each must be on). The rule is checked by the section at
    `scope` ("" = RunConfig, else a dotted path such as "objective"), in its __post_init__ after that
    section's own checks: the smallest section that holds the switch and the fields and that by itself
    ignores them. The loss's own config mirrors TRL's, which carries ε, the SAPO temperatures and VESPO's
    k / λ whatever the loss type, so the objective refuses those; the curriculum's functions read all of its
    fields whatever the kind, so the run refuses those.
    """

    key: str  # a short name (tests, docs)
    scope: str
    needs: str  # the switch, as flags
    what: str  # what the mechanism is (and why the fields need it)
    on: Callable[[Any], bool]  # over the section at `scope`
    state: Callable[[Any], str]  # how this run has it, as flags
    fields: tuple[str, ...]  # dotted paths below `scope`, in the order they are reported
    fix: str = ""  # what to do; default "drop it, or use {needs}"

    @property
    def paths(self) -> tuple[str, ...]:
        """The fields as dotted RunConfig paths."""
        return tuple(f"{self.scope}.{f}" if self.scope else f for f in self.fields)

    def why(self, section: Any) -> str:
        fix = self.fix or f"drop it, or use {self.needs}"
        return f"only used with {self.needs} ({self.what}); this run has {self.state(section)}: {fix}"


def _algo(o) -> str:
    return f"--algorithm={o.algorithm}"


def _loss_objective(o) -> str:
    return f"--objective={o.loss.objective}"


def _controller_mechanisms() -> tuple[Mechanism, ...]:
    """One mechanism per optional controller parameter: the controllers that take it (CONTROLLER_PARAMS)."""
    out = []
    for name in ("target", "horizon", "delta", "min_coef", "max_coef", "low", "high", "up", "down"):
        kinds = tuple(k for k, ps in CONTROLLER_PARAMS.items() if name in ps)
        out.append(
            Mechanism(
                f"controller:{name}",
                "objective.controller",
                "--controller=" + "|".join(kinds),
                "a parameter of those controllers",
                lambda c, kinds=kinds: c.kind in kinds,
                lambda c: f"--controller={c.kind}",
                (name,),
            )
        )
    return tuple(out)


SUB_SETTINGS: tuple[Mechanism, ...] = (
    # ---- the model and the problems
    Mechanism(
        "from_scratch",
        "model",
        "no --init_from",
        "a model trained from scratch: a checkpoint brings its own architecture",
        lambda m: not m.init_from,
        lambda m: f"--init_from={m.init_from}",
        ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "qkv_bias", "tie_embeddings"),
        fix="drop it (the checkpoint's config.json / GGUF metadata decides the shape)",
    ),
    Mechanism(
        "procedural",
        "tasks",
        "--source=procedural",
        "the procedural suite's levels and sizes; MBPP has its own splits",
        lambda t: t.source == "procedural",
        lambda t: f"--source={t.source}",
        ("sft_levels", "rl_levels", "eval_levels", "train_per_level"),
    ),
    Mechanism(
        "file_source",
        "tasks",
        "--source=file (--train_data)",
        "a problems file to train on",
        lambda t: t.source == "file",
        lambda t: f"--source={t.source}",
        ("train_data", "grade_tests"),
    ),
    Mechanism(
        "codeio_source",
        "tasks",
        "--source=codeio",
        "the CodeI/O tasks",
        lambda t: t.source == "codeio",
        lambda t: f"--source={t.source}",
        ("codeio_tasks",),
    ),
    Mechanism(
        "problem_files",
        "tasks",
        "--train_data or --eval_data",
        "problems read from a file",
        lambda t: bool(t.train_data or t.eval_data),
        lambda t: "neither --train_data nor --eval_data",
        ("data_format", "visible_tests", "max_tests", "max_problems", "difficulty"),
    ),
    Mechanism(
        "chat",
        "",
        "--prompt_format=chat",
        "chat prompts",
        lambda c: c.tasks.prompt_format == "chat",
        lambda c: f"--prompt_format={c.tasks.prompt_format}",
        ("tasks.system_prompt", "tasks.chat_instruction", "tasks.program_instruction"),
    ),
    Mechanism(
        "chat_function_problems",
        "",
        "--source=procedural|file, --eval_data or --eval_humaneval",
        "function-completion problems, the ones --chat_instruction words",
        lambda c: c.tasks.source in ("procedural", "file") or bool(c.tasks.eval_data) or c.eval.humaneval,
        lambda c: f"--source={c.tasks.source}, no --eval_data and no --eval_humaneval",
        ("tasks.chat_instruction",),
    ),
    Mechanism(
        "chat_program_problems",
        "",
        "--source=mbpp|codeio|file, --eval_data or --eval_mbpp > 0",
        "whole-program problems (MBPP, CodeI/O, contest problems), the ones --program_instruction words",
        lambda c: c.tasks.source in ("mbpp", "codeio", "file") or bool(c.tasks.eval_data) or c.eval.mbpp > 0,
        lambda c: f"--source={c.tasks.source}, no --eval_data and --eval_mbpp=0",
        ("tasks.program_instruction",),
    ),
    # ---- the objective
    Mechanism(
        "ppo",
        "objective",
        "--algorithm=ppo",
        "token-level PPO",
        lambda o: o.algorithm == "ppo",
        _algo,
        (
            "ppo.gamma",
            "ppo.lam",
            "ppo.vf_coef",
            "ppo.cliprange_value",
            "ppo.whiten_advantages",
            "ppo.kl_estimator",
        ),
    ),
    Mechanism(
        "dppo",
        "objective",
        "--algorithm=dppo",
        "DPPO's trust region",
        lambda o: o.algorithm == "dppo",
        _algo,
        ("dppo.mask_low", "dppo.mask_high", "dppo.divergence", "dppo.kl_coef"),
    ),
    Mechanism(
        "group_advantages",
        "objective",
        "--algorithm=grpo|dppo",
        "group-relative advantages; PPO's are GAE from its value head",
        lambda o: o.algorithm != "ppo",
        _algo,
        ("adv_ddof", "adv_eps"),
    ),
    Mechanism(
        "pool_baseline_scale",
        "objective",
        "--baseline=pool|mix",
        "the advantage scale of all-equal groups under a pool baseline",
        lambda o: o.baseline != "group",
        lambda o: f"--baseline={o.baseline}",
        ("baseline_std_floor",),
    ),
    Mechanism(
        "mix_baseline",
        "objective",
        "--baseline=mix",
        "the weight of the pool baseline in the mix",
        lambda o: o.baseline == "mix",
        lambda o: f"--baseline={o.baseline}",
        ("baseline_mix",),
    ),
    Mechanism(
        "kl",
        "objective",
        "--kl_coef > 0 (or a --kl_schedule or KL controller that makes β > 0)",
        "a KL penalty",
        lambda o: o.uses_kl,
        lambda o: f"--kl_coef={o.kl_coef}",
        ("loss.kl_estimator", "loss.kl_anchor", "loss.kl_bias_correction", "ppo.kl_estimator"),
    ),
    Mechanism(
        "loss_kl",
        "objective",
        "--algorithm=grpo|dppo",
        "the loss's KL term; --algorithm=ppo puts the KL in the per-token reward, with --ppo_kl_estimator",
        lambda o: o.algorithm != "ppo",
        _algo,
        ("loss.kl_estimator", "loss.kl_bias_correction"),
    ),
    Mechanism(
        "entropy_bonus",
        "objective",
        "--entropy_coef > 0 (or an entropy controller)",
        "an entropy bonus",
        lambda o: o.uses_entropy_bonus,
        lambda o: f"--entropy_coef={o.entropy_coef}",
        ("loss.entropy_bonus",),
    ),
    Mechanism(
        "reference_updates",
        "objective",
        "--ref_update=hard|ema",
        "reference updates",
        lambda o: o.ref_update != "frozen",
        lambda o: f"--ref_update={o.ref_update}",
        ("ref_update_every",),
    ),
    Mechanism(
        "ema_reference",
        "objective",
        "--ref_update=ema",
        "the EMA reference",
        lambda o: o.ref_update == "ema",
        lambda o: f"--ref_update={o.ref_update}",
        ("ref_ema_tau",),
    ),
    Mechanism(
        "multiscale",
        "objective",
        "--multiscale_w_tests > 0",
        "multi-scale advantages",
        lambda o: o.multiscale_w_tests > 0,
        lambda o: f"--multiscale_w_tests={o.multiscale_w_tests}",
        ("multiscale_mode",),
    ),
    Mechanism(
        "ratio_policy_term",
        "objective",
        "--algorithm=grpo|ppo",
        "a clipped-ratio policy term; DPPO's trust region (--dppo_mask_low / --dppo_mask_high) replaces it",
        lambda o: o.algorithm != "dppo",
        _algo,
        ("loss.eps_low", "loss.eps_high", "loss.dual_clip", "loss.delta"),
    ),
    Mechanism(
        "clip_range",
        "objective",
        "--objective=clip",
        "the clipped surrogate's lower clip range",
        lambda o: o.loss.objective == "clip",
        _loss_objective,
        ("loss.eps_low",),
    ),
    Mechanism(
        "clip_or_cispo_cap",
        "objective",
        "--objective=clip|cispo",
        "the clipped surrogate's upper clip range, or CISPO's cap",
        lambda o: o.loss.objective in ("clip", "cispo"),
        _loss_objective,
        ("loss.eps_high",),
    ),
    Mechanism(
        "sapo",
        "objective",
        "--objective=sapo",
        "SAPO's soft gate",
        lambda o: o.loss.objective == "sapo",
        _loss_objective,
        ("loss.sapo_temp_pos", "loss.sapo_temp_neg"),
    ),
    Mechanism(
        "vespo",
        "objective",
        "--objective=vespo",
        "VESPO's sequence weight",
        lambda o: o.loss.objective == "vespo",
        _loss_objective,
        ("loss.vespo_k_pos", "loss.vespo_lambda_pos", "loss.vespo_k_neg", "loss.vespo_lambda_neg"),
    ),
    Mechanism(
        "clip",
        "objective.loss",
        "--objective=clip",
        "options of the clipped surrogate",
        lambda loss: loss.objective == "clip",
        lambda loss: f"--objective={loss.objective}",
        ("dual_clip", "delta"),
    ),
    Mechanism(
        "is_correction",
        "objective.loss",
        "--tis_cap or --tis_min",
        "the importance-sampling correction",
        lambda loss: loss.tis_enabled,
        lambda loss: "neither",
        ("tis_level", "tis_mode"),
    ),
    Mechanism(
        "adaptive_controller",
        "objective.controller",
        "--controller=" + "|".join(k for k in CONTROLLER_PARAMS if k != "constant"),
        "an adaptive controller; a constant one drives nothing",
        lambda c: c.kind != "constant",
        lambda c: f"--controller={c.kind}",
        ("acts_on",),
    ),
    *_controller_mechanisms(),
    # ---- the rollout
    Mechanism(
        "dynamic_sampling",
        "rollout",
        "--dynamic_sampling",
        "DAPO's dynamic sampling",
        lambda r: r.dynamic_sampling,
        lambda r: "--nodynamic_sampling",
        ("dynamic_max_rounds",),
    ),
    Mechanism(
        "pool_baseline",
        "",
        "--baseline=pool|mix",
        "a pool baseline: nothing else samples the pool's members; with --baseline=group a pool only stores "
        "snapshots and logs pool/size and pool/diversity",
        lambda c: c.objective.baseline != "group",
        lambda c: f"--baseline={c.objective.baseline}",
        (
            "pool.k_schedule",
            "pool.push_every",
            "pool.eval_members",
            "pool.samples_per_member",
            "pool.explore_fraction",
            "pool.capacity",
        ),
    ),
    Mechanism(
        "exploration",
        "pool",
        "--pool_explore_fraction > 0",
        "exploration members",
        lambda p: p.explore_fraction > 0,
        lambda p: f"--pool_explore_fraction={p.explore_fraction}",
        ("explore_mode",),
    ),
    Mechanism(
        "explore_temperature",
        "pool",
        "--pool_explore_fraction > 0 and --pool_explore_mode=temperature",
        "exploration members that sample hotter",
        lambda p: p.explore_fraction > 0 and p.explore_mode == "temperature",
        lambda p: f"--pool_explore_fraction={p.explore_fraction} --pool_explore_mode={p.explore_mode}",
        ("explore_temperature",),
    ),
    Mechanism(
        "explore_noise",
        "pool",
        "--pool_explore_fraction > 0 and --pool_explore_mode=param_noise",
        "exploration members with parameter noise",
        lambda p: p.explore_fraction > 0 and p.explore_mode == "param_noise",
        lambda p: f"--pool_explore_fraction={p.explore_fraction} --pool_explore_mode={p.explore_mode}",
        ("explore_noise",),
    ),
    Mechanism(
        "lora",
        "lora",
        "--lora_rank > 0",
        "LoRA adapters",
        lambda lo: lo.rank > 0,
        lambda lo: f"--lora_rank={lo.rank}",
        ("alpha", "targets"),
    ),
    Mechanism(
        "replay",
        "replay",
        "--replay_fraction > 0",
        "prioritized replay",
        lambda r: r.fraction > 0,
        lambda r: f"--replay_fraction={r.fraction}",
        ("capacity", "alpha"),
    ),
    Mechanism(
        "pass_rate_estimates",
        "",
        "a --curriculum other than uniform, or --replay_fraction > 0",
        "the pass-rate estimates s(q) that a curriculum samples by and replay prioritises by",
        lambda c: c.curriculum.kind != "uniform" or c.replay.enabled,
        lambda c: "--curriculum=uniform and no replay",
        ("curriculum.ema", "curriculum.prior"),
    ),
    Mechanism(
        "pass_rate_curriculum",
        "",
        "--curriculum=pass_rate|levels+pass_rate",
        "sampling by pass rate, P(q) ∝ max(1 − s(q), floor)",
        lambda c: c.curriculum.uses_pass_rate,
        lambda c: f"--curriculum={c.curriculum.kind}",
        ("curriculum.floor",),
    ),
    Mechanism(
        "level_curriculum",
        "",
        "--curriculum=levels|levels+pass_rate",
        "level unlocking",
        lambda c: c.curriculum.uses_levels,
        lambda c: f"--curriculum={c.curriculum.kind}",
        ("curriculum.start_level", "curriculum.promote", "curriculum.demote", "curriculum.min_attempts"),
    ),
    Mechanism(
        "reference_time_limits",
        "sandbox",
        "--sandbox_time_limits=reference",
        "per-problem time limits from the reference solutions",
        lambda s: s.time_limits == "reference",
        lambda s: f"--sandbox_time_limits={s.time_limits}",
        ("time_limit_floor_s", "time_limit_factor"),
    ),
    # ---- the run
    Mechanism(
        "resume",
        "",
        "--resume",
        "resuming from the workdir's checkpoints",
        lambda c: c.resume,
        lambda c: "--noresume",
        ("resume_from",),
    ),
)


def _field_default(section: Any, path: str) -> Any:
    """The declared default of the field at dotted `path` below the section instance `section`."""
    *parents, leaf = path.split(".")
    for p in parents:
        section = getattr(section, p)
    return type(section).__dataclass_fields__[leaf].default


def _check_sub_settings(section: Any, scope: str) -> None:
    """The rule of SUB_SETTINGS for the mechanisms checked at `scope` (`section` is the instance there)."""
    for m in SUB_SETTINGS:
        if m.scope != scope or m.on(section):
            continue
        for f in m.fields:
            if get_path(section, f) != _field_default(section, f):
                fail(section, f, m.why(section))


# ------------------------------------------------------------------------------------------------------------
# sections
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The transformer policy (grpo_jax.policies.transformer): a pretrained checkpoint (`init_from`, with its
    own architecture and tokenizer) or one trained from scratch with the shape below and the procedural
    512-id tokenizer."""

    FLAG_PREFIX: ClassVar[str] = ""
    init_from: str = opt(
        "",
        "Pretrained checkpoint: a Hugging Face directory (config.json + safetensors), a "
        ".gguf file, or a known name (smollm2-135m-instruct); its architecture replaces the "
        "shape flags below. Empty = a random init of that shape. A pretrained model's defaults are no SFT "
        "(--sft_steps=0) and chat prompts (--prompt_format=chat) unless those flags are given.",
    )
    tokenizer: str = opt(
        "",
        "Tokenizer (a directory with tokenizer.json, or a .gguf file); empty = the "
        "checkpoint's own (init_from), or the procedural 512-id tokenizer without one.",
    )
    remat: str = opt(
        "dots_no_batch",
        "Per-layer rematerialisation in the backward pass: none (keep everything) | full (recompute "
        "each layer from its input) | dots (keep matmul outputs) | dots_no_batch (keep the projections' "
        "outputs, recompute the elementwise ops and attention scores). The default was measured faster "
        "AND smaller than none on this CPU (experiments.bench: tiny step 1.49 vs 1.72 s, peak RSS 932 vs "
        "1465 MB; small 8.76 vs 9.58 s, 2365 vs 4433 MB): the backward reads less memory.",
        choices=REMAT_POLICIES,
    )
    logp_chunk: int = opt(
        0,
        "Compute token log-probs and entropies from the LM head in chunks of this many "
        "positions, never materialising [B, G, T, V] logits (0 = full logits).",
    )
    d_model: int = opt(128, "Model width.")
    n_layers: int = opt(2, "Transformer layers.")
    n_heads: int = opt(4, "Query heads.")
    n_kv_heads: int = opt(2, "Key/value heads (grouped-query attention).")
    d_ff: int = opt(512, "MLP width.")
    qkv_bias: bool = opt(True, "Bias on the q/k/v projections (Qwen2).")
    tie_embeddings: bool = opt(True, "Tie the LM head to the embedding.")
    compute_dtype: str = opt(
        "float32",
        "Compute dtype: float32, bfloat16 or float16 (master weights, logits, "
        "log-softmax, ratios and KL stay float32).",
        choices=DTYPES,
    )

    def __post_init__(self):
        for name in ("init_from", "tokenizer"):
            if getattr(self, name):
                try:
                    resolve_checkpoint(getattr(self, name))
                except FileNotFoundError as e:
                    fail(self, name, str(e).split(": ", 1)[-1])
        _positive(self, ("logp_chunk",), strict=False)
        _positive(self, ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"))
        if self.d_model % self.n_heads:
            fail(self, "n_heads", f"must divide d_model={self.d_model}")
        if self.n_heads % self.n_kv_heads:
            fail(self, "n_kv_heads", f"must divide n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            fail(self, "n_heads", f"d_model / n_heads = {self.d_model // self.n_heads} must be even (RoPE)")
        _choice(self, "compute_dtype", DTYPES)
        _choice(self, "remat", REMAT_POLICIES)
        _check_sub_settings(self, "model")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """What the model trains and is evaluated on, and how it is prompted.

    source "procedural": the function-synthesis suite (grpo_jax.codegen.tasks; levels, sizes, held-out split
    by construction); "mbpp": the bundled MBPP, RL on its train split (task ids 601-974), held-out = its test
    split (11-510). prompt_format "plain" continues the prompt; "chat" wraps it in an instruction through the
    tokenizer's chat template and grades the first ```python block of the reply (instruct models).
    """

    FLAG_PREFIX: ClassVar[str] = ""
    source: str = opt(
        "auto",
        "Problems: procedural (the synthetic suite), mbpp (train split for RL, test split held out), codeio "
        "(the CodeI/O tasks of the reasoning-gym wheel, docs/data/CODEIO.md: train split for RL, held-out "
        "split), file (--train_data); auto (the default) = file when --train_data is given, else procedural.",
        choices=("auto", *TASK_SOURCES),
    )
    train_data: str = opt(
        "",
        "A problems file to train on, in any format and container of docs/DATA_FORMATS.md (.jsonl, "
        ".jsonl.gz, .json, .parquet: a file, a directory of shards or a glob, .arrow, a datasets "
        "save_to_disk directory); selects --source=file.",
    )
    eval_data: str = opt(
        "",
        "A problems file for the held-out evaluation, graded on its hidden tests only (any source); empty: "
        "the source's own held-out split (--source=file: --heldout_per_level problems of --train_data, "
        "chosen by a hash of their ids and kept out of training).",
    )
    data_format: str = opt(
        "auto",
        "The format of --train_data / --eval_data; auto = detected from the columns (parquet / Arrow) or the "
        "first row's fields (JSON).",
        choices=DATA_FORMATS,
    )
    grade_tests: str = opt(
        "all",
        "Which tests grade the training reward of file problems: all (public + hidden) or private (hidden "
        "only). Held-out evaluation always grades on the hidden tests.",
        choices=GRADE_TESTS,
    )
    visible_tests: int = opt(
        0,
        "Public tests of a file problem shown in its prompt (-1: all; 0: none, since the statements of APPS, "
        "CodeContests and LiveCodeBench already show their examples).",
    )
    max_tests: int = opt(0, "Keep at most this many hidden tests per file problem (0: all).")
    max_problems: int = opt(
        0,
        "Read at most this many problems of each --train_data / --eval_data input, in file order (0: all); "
        "a large file is read only as far as needed.",
    )
    difficulty: str = opt(
        "",
        "Keep only the file problems of these difficulties: comma-separated labels (easy,medium; any case) "
        "or inclusive integer ranges (800-1200), matched against the format's difficulty field "
        "(docs/DATA_FORMATS.md); empty: all.",
    )
    codeio_tasks: int = opt(
        0,
        "--source=codeio: use the first N of the ~3 200 CodeI/O source tasks (0: all; the full set is built "
        "once, about 4 minutes on 2 cores, then cached).",
    )
    prompt_format: str = opt(
        "auto",
        "plain (the model continues the prompt) or chat (the prompt in an instruction through the chat "
        "template; code = the reply's first ```python block); auto (the default) = chat for a pretrained "
        "--init_from model (an instruct model: give plain for a base model without a chat template), plain "
        "for a model trained from scratch.",
        choices=("auto", *PROMPT_FORMATS),
    )
    chat_instruction: str = opt(
        DEFAULT_INSTRUCTION,
        "The chat user turn for function-completion problems; {prompt} is replaced by the problem's prompt.",
    )
    program_instruction: str = opt(
        PROGRAM_INSTRUCTION,
        "The chat user turn for whole-program problems "
        "(MBPP); {prompt} is replaced by the problem's text with its tests.",
    )
    system_prompt: str = opt("", "A system turn for chat prompts (empty = the template's default).")
    sft_levels: tuple[int, ...] = opt((0, 1), "Task levels of the SFT warm start.")
    rl_levels: tuple[int, ...] = opt((0, 1), "Task levels GRPO trains on.")
    eval_levels: tuple[int, ...] = opt((0, 1), "Held-out task levels evaluated.")
    train_per_level: int = opt(300, "Training problems per level.")
    heldout_per_level: int = opt(40, "Held-out problems per level.")
    prompt_len: int = opt(64, "Prompt length in tokens (left-padded).")

    def __post_init__(self):
        for f in ("sft_levels", "rl_levels", "eval_levels"):
            levels = getattr(self, f)
            if not levels or any(lv not in LEVELS for lv in levels) or len(set(levels)) != len(levels):
                fail(self, f, f"must be distinct levels from {', '.join(map(str, LEVELS))}")
        _positive(self, ("train_per_level", "heldout_per_level", "prompt_len"))
        _choice(self, "source", ("auto", *TASK_SOURCES))
        if self.source == "auto":
            object.__setattr__(self, "source", "file" if self.train_data else "procedural")
        if self.source == "file" and not self.train_data:
            fail(self, "source", "--source=file needs --train_data=PATH (a problems file)")
        _choice(self, "data_format", DATA_FORMATS)
        _choice(self, "grade_tests", GRADE_TESTS)
        if self.visible_tests < -1:
            fail(self, "visible_tests", "must be -1 (all), 0 (none) or a positive count")
        _positive(self, ("max_tests", "max_problems", "codeio_tasks"), strict=False)
        _choice(self, "prompt_format", ("auto", *PROMPT_FORMATS))
        for name in ("chat_instruction", "program_instruction"):
            if "{prompt}" not in getattr(self, name):
                fail(self, name, "must contain {prompt} (where the problem's prompt goes)")
        _check_sub_settings(self, "tasks")

    @property
    def prompt(self):
        """The grpo_jax.codegen.pipeline.PromptFormat of the problems of this config."""
        if self.prompt_format == "auto":
            raise ValueError(
                "TaskConfig.prompt_format='auto' is resolved by RunConfig (chat for a pretrained --init_from "
                "model, plain from scratch): read the prompt format of a RunConfig's tasks"
            )
        return PromptFormat(
            self.prompt_format, self.chat_instruction, self.system_prompt, self.program_instruction
        )


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start on the reference solutions (grpo_jax.train.sft)."""

    FLAG_PREFIX: ClassVar[str] = "sft_"
    steps: int | None = opt(
        None,
        "SFT minibatch steps (0 = no warm start); auto (the default) = 300 for a model trained from scratch, "
        "0 for a pretrained --init_from model (RunConfig resolves it).",
        none_word="auto",
    )
    batch: int = opt(32, "SFT batch size.")
    lr: float = opt(3e-3, "SFT learning rate (AdamW).")
    warmup_steps: int = opt(20, "SFT linear learning-rate warm-up steps (at most --sft_steps).")
    from_workdir: str = opt(
        "",
        "Take the post-SFT parameters from another run's workdir (its step-0 checkpoint, e.g. of a run "
        "with --steps=0) instead of running SFT here; that run must equal this one in every field that "
        "decides them (config.SFT_INPUTS: seed, model, SFT tasks and settings; checked). Empty = SFT here.",
        flag="sft_from",
    )

    def __post_init__(self):
        if self.steps is not None and not (_is_int(self.steps) and self.steps >= 0):
            fail(self, "steps", "must be an integer >= 0, or auto (None)")
        _positive(self, ("warmup_steps",), strict=False)
        _positive(self, ("batch", "lr"))


ENTROPY_BONUS = ("aggregate", "token_mean")


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """The policy loss of every algorithm (grpo_jax.algorithms.policy_loss): policy term, clipping, KL
    estimator and anchor, aggregation, IS correction, masks (frozen and hashable: a static jit argument).

    Each field's meaning is in its `help` metadata (also the text of the command-line flag that sets it,
    grpo_jax.cli). `max_len` is the configured max completion length L of the "constant" aggregation; the run
    config derives it (RunConfig._derive), and `aggregate` raises if "constant" is used without it.
    """

    eps_low: float = dataclasses.field(
        default=0.2, metadata={"help": "Clip range below 1: clip(ρ, 1 − eps_low, 1 + eps_high)."}
    )
    eps_high: float = dataclasses.field(
        default=0.2, metadata={"help": "Clip range above 1 (DAPO clip-higher: 0.28; GSPO: 4e-4)."}
    )
    dual_clip: float | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Dual clip c > 1 (Ye et al. 2020): for A < 0 the objective is max(J, c·A); none = off."
        },
    )
    delta: float | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Two-sided clip δ > 1 (INTELLECT-2 / TRL delta): the unclipped ratio is min(ρ, δ); "
            "none = off."
        },
    )
    kl_estimator: str = dataclasses.field(
        default="k3",
        metadata={
            "help": f"KL estimator, one of {', '.join(KL_KINDS)} (DeepSeekMath: k3); --algorithm=ppo uses "
            "--ppo_kl_estimator instead."
        },
    )
    kl_anchor: str = dataclasses.field(
        default="ref",
        metadata={
            "help": "KL anchor: ref (canonical GRPO, the frozen π_ref) or old (the seed document's KL to "
            "π_old; identically zero unless μ = num_iterations > 1)."
        },
    )
    kl_bias_correction: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "TRL use_bias_correction_kl: multiply the per-token KL by ρ = exp(logp − sg(logp_old))."
        },
    )
    aggregation: str = dataclasses.field(
        default="seq_mean_token_mean",
        metadata={
            "help": "Loss aggregation: seq_mean_token_mean (GRPO), token_mean (DAPO), constant (Dr. GRPO, "
            "1/(N·L) with L = --max_new_tokens), seq_mean (GSPO)."
        },
    )
    max_len: int | None = dataclasses.field(
        default=None, metadata={"derived": "the rollout's max_new_tokens (Dr. GRPO's L)"}
    )
    importance_level: str = dataclasses.field(
        default="token",
        metadata={
            "help": "Importance ratio: token (GRPO), sequence (GSPO: one ratio and clip per sequence) or "
            "sequence_token (GSPO-token)."
        },
    )
    tis_cap: float | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Importance-sampling correction for off-policy rollouts (replay, async; TRL's vLLM IS "
            "correction): the upper bound C_max of the ratio π_old/π_behaviour that weights each token's "
            "policy term; none = off (unless --tis_min is set)."
        },
    )
    tis_min: float | None = dataclasses.field(
        default=None,
        metadata={"help": "IS correction lower bound C_min (TRL vllm_importance_sampling_clip_min)."},
    )
    tis_level: str = dataclasses.field(
        default="token",
        metadata={
            "help": "IS correction granularity: token (one ratio per token) or sequence (exp of the summed "
            "log differences, one ratio per sequence)."
        },
    )
    tis_mode: str = dataclasses.field(
        default="truncate",
        metadata={"help": "IS correction outside [C_min, C_max]: truncate (clamp) or mask (weight 0)."},
    )
    objective: str = dataclasses.field(
        default="clip",
        metadata={
            "help": "Policy term: clip (PPO/GRPO clipped surrogate; TRL grpo/bnpo/dr_grpo/dapo/luspo), cispo "
            "(MiniMax-M1: −sg(min(ρ, eps_high))·A·logp; eps_high is the cap itself, e.g. 5), sapo (soft gate "
            "−σ(τ(ρ−1))·4/τ·A) or vespo (−sg(φ(w))·A·logp, φ a gamma weight of the sequence ratio)."
        },
    )
    sapo_temp_pos: float = dataclasses.field(
        default=1.0, metadata={"help": "SAPO temperature τ for A > 0 (TRL sapo_temperature_pos)."}
    )
    sapo_temp_neg: float = dataclasses.field(
        default=1.05, metadata={"help": "SAPO temperature τ for A ≤ 0 (TRL sapo_temperature_neg)."}
    )
    vespo_k_pos: float = dataclasses.field(default=2.0, metadata={"help": "VESPO k for A ≥ 0."})
    vespo_lambda_pos: float = dataclasses.field(default=3.0, metadata={"help": "VESPO λ for A ≥ 0."})
    vespo_k_neg: float = dataclasses.field(default=3.0, metadata={"help": "VESPO k for A < 0."})
    vespo_lambda_neg: float = dataclasses.field(default=2.0, metadata={"help": "VESPO λ for A < 0."})
    top_entropy_quantile: float = dataclasses.field(
        default=1.0,
        metadata={
            "help": "Keep the policy term only on the top-q quantile of tokens by entropy (Wang et al. 2025, "
            "'Beyond the 80/20 rule'; TRL top_entropy_quantile): 1 = all tokens, 0.2 = the paper's."
        },
    )
    off_policy_mask_threshold: float | None = dataclasses.field(
        default=None,
        metadata={
            "help": "DeepSeek-V3.2 off-policy sequence mask δ: drop the policy term of a sequence with A < 0 "
            "whose mean (sampler − current) log-prob difference exceeds δ; none = off."
        },
    )
    entropy_bonus: str = dataclasses.field(
        default="aggregate",
        metadata={
            "help": "How the entropy bonus enters: aggregate (per token, aggregated like the loss) or "
            "token_mean (TRL: minus coef × the masked token mean of H, whatever the loss aggregation)."
        },
    )

    def __post_init__(self):
        if not (_is_real(self.eps_low) and self.eps_low >= 0):
            fail(self, "eps_low", "must be a number >= 0")
        if not (_is_real(self.eps_high) and self.eps_high >= 0):
            fail(self, "eps_high", "must be a number >= 0")
        if self.dual_clip is not None and not (_is_real(self.dual_clip) and self.dual_clip > 1):
            fail(self, "dual_clip", "must be none (off) or a number > 1")
        if self.delta is not None and not (_is_real(self.delta) and self.delta > 1):
            fail(self, "delta", "must be none (off) or a number > 1")
        if self.kl_estimator not in KL_KINDS:
            fail(self, "kl_estimator", f"valid: {', '.join(KL_KINDS)}")
        if self.kl_anchor not in KL_ANCHORS:
            fail(self, "kl_anchor", f"valid: {', '.join(KL_ANCHORS)}")
        if not isinstance(self.kl_bias_correction, bool):
            fail(self, "kl_bias_correction", "must be True or False")
        if self.aggregation not in AGGREGATIONS:
            fail(self, "aggregation", f"valid: {', '.join(AGGREGATIONS)}")
        if self.max_len is not None and not (_is_int(self.max_len) and self.max_len > 0):
            fail(self, "max_len", "must be none or a positive int")
        if self.importance_level not in IMPORTANCE_LEVELS:
            fail(self, "importance_level", f"valid: {', '.join(IMPORTANCE_LEVELS)}")
        if self.tis_cap is not None and not (_is_real(self.tis_cap) and self.tis_cap > 0):
            fail(self, "tis_cap", "must be none (off) or a number > 0")
        if self.tis_min is not None and not (_is_real(self.tis_min) and self.tis_min >= 0):
            fail(self, "tis_min", "must be none or a number >= 0")
        if self.tis_cap is not None and self.tis_min is not None and self.tis_min > self.tis_cap:
            fail(self, "tis_min", f"must be <= tis_cap ({self.tis_cap})")
        for name, valid in (
            ("tis_level", TIS_LEVELS),
            ("tis_mode", TIS_MODES),
            ("objective", OBJECTIVES),
            ("entropy_bonus", ENTROPY_BONUS),
        ):
            if getattr(self, name) not in valid:
                fail(self, name, f"valid: {', '.join(valid)}")
        for name in ("sapo_temp_pos", "sapo_temp_neg"):
            if not (_is_real(getattr(self, name)) and getattr(self, name) > 0):
                fail(self, name, "must be a number > 0")
        for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
            if not _is_real(getattr(self, name)):
                fail(self, name, "must be a number")
        if not (_is_real(self.top_entropy_quantile) and 0.0 <= self.top_entropy_quantile <= 1.0):
            fail(self, "top_entropy_quantile", "must be a number in [0, 1]")
        if self.off_policy_mask_threshold is not None and not _is_real(self.off_policy_mask_threshold):
            fail(self, "off_policy_mask_threshold", "must be none (off) or a number")
        if self.objective == "vespo" and self.tis_enabled and self.tis_level != "token":
            fail(self, "tis_level", "objective=vespo folds a token-level IS ratio into its weight: use token")
        _check_sub_settings(self, "objective.loss")

    @property
    def tis_enabled(self) -> bool:
        """The IS correction is on when either bound is set."""
        return self.tis_cap is not None or self.tis_min is not None

    @property
    def uses_behaviour(self) -> bool:
        """Does the loss need the sampler's log-probs (IS correction or the off-policy mask)?"""
        return self.tis_enabled or self.off_policy_mask_threshold is not None


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """An adaptive coefficient controller (grpo_jax.core.controllers) and the coefficient it drives.

    The parameters left at None take the controller's own defaults; giving one the kind does not take is an
    error (CONTROLLER_PARAMS lists which kind takes which; SUB_SETTINGS has the rule).
    """

    FLAG_PREFIX: ClassVar[str] = "controller_"
    kind: str = opt(
        "constant",
        "Adaptive coefficient controller: constant, seed_entropy (the seed's x1.2/x0.8 "
        "rule), skywork_entropy (Skywork-OR1), ppo_adaptive_kl (PPO), ziegler_kl (Ziegler et al.).",
        flag="controller",
        choices=CONTROLLER_KINDS,
    )
    acts_on: str = opt(
        "auto",
        "The coefficient it drives: auto (entropy controllers -> entropy_coef, KL "
        "controllers -> kl_coef), entropy_coef, or kl_coef (the seed's literal reading).",
        choices=("auto", "entropy_coef", "kl_coef"),
    )
    target: float | None = opt(
        None,
        "Target of the measured entropy / KL (none = the controller's default: "
        "seed 2.0, skywork 0.2, ppo 0.01, ziegler 6.0).",
    )
    horizon: int | None = opt(None, "ziegler_kl horizon (none = 10000): β ← β(1 + e·n/horizon).")
    delta: float | None = opt(None, "skywork_entropy step Δ of the coefficient (none = 0.005).")
    min_coef: float | None = opt(None, "Lower bound of the coefficient (seed_entropy, skywork_entropy).")
    max_coef: float | None = opt(None, "Upper bound of the coefficient (seed_entropy, skywork_entropy).")
    low: float | None = opt(None, "seed_entropy: raise when H < low·target (none = 0.8).")
    high: float | None = opt(None, "seed_entropy: lower when H > high·target (none = 1.2).")
    up: float | None = opt(None, "seed_entropy: raise factor (none = 1.2).")
    down: float | None = opt(None, "seed_entropy: lower factor (none = 0.8).")

    def __post_init__(self):
        _choice(self, "kind", CONTROLLER_KINDS)
        _choice(self, "acts_on", ("auto", "entropy_coef", "kl_coef"))
        for name in ("target", "horizon", "delta", "up", "down", "low", "high"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                fail(self, name, "must be > 0")
        _check_sub_settings(self, "objective.controller")

    @property
    def measures(self) -> str:
        return "kl" if self.kind in KL_CONTROLLERS else "entropy"

    @property
    def drives(self) -> str | None:
        """The coefficient the controller moves: "kl_coef", "entropy_coef", or None (constant)."""
        if self.kind == "constant":
            return None
        if self.acts_on != "auto":
            return self.acts_on
        return "kl_coef" if self.kind in KL_CONTROLLERS else "entropy_coef"

    def params(self) -> dict[str, float]:
        """Factory keyword arguments: the parameters that were given."""
        return {n: getattr(self, n) for n in CONTROLLER_PARAMS[self.kind] if getattr(self, n) is not None}


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO for the language model (--algorithm=ppo; GRPO_MATH.md §2; TRL PPOTrainer's defaults).

    The critic is a scalar value head on the policy transformer (shared trunk: one extra D -> 1 projection
    of the final hidden state, zero-initialised; its gradient from the value loss reaches the trunk). Per
    token: r_t = −β·k(log π_old − log π_ref) (β = --kl_coef, k = kl_estimator; none without a reference),
    plus the sandbox reward of the completion on its last valid token; GAE with V after the last token = 0;
    returns R̂ = Â + V_old; Â whitened over the batch's valid tokens; loss = the clipped surrogate of
    PolicyLossConfig on those per-token Â + vf_coef · 0.5·max((V−R̂)², (clip(V, V_old ± cliprange_value)−R̂)²).
    """

    FLAG_PREFIX: ClassVar[str] = "ppo_"
    gamma: float = opt(1.0, "--algorithm=ppo: GAE discount γ over tokens, in [0, 1] (TRL: 1).")
    lam: float = opt(0.95, "--algorithm=ppo: GAE λ, in [0, 1] (TRL: 0.95).")
    vf_coef: float = opt(
        0.1,
        "--algorithm=ppo: value-loss coefficient c_v (TRL: 0.1); the critic is a value head on the policy's "
        "trunk, so this also weighs how much the value loss moves the shared layers.",
    )
    cliprange_value: float = opt(
        0.2, "--algorithm=ppo: value clip ε_v: V is clipped to V_old ± ε_v in the value loss (TRL: 0.2)."
    )
    whiten_advantages: bool = opt(
        True, "--algorithm=ppo: whiten the GAE advantages over the batch's valid tokens (TRL: on)."
    )
    kl_estimator: str = opt(
        "k1",
        "--algorithm=ppo: KL estimate k_t of the KL-shaped per-token reward r_t = −β·k_t, β = --kl_coef "
        "(TRL kl_estimator: k1 = log π_old − log π_ref).",
        choices=KL_KINDS,
    )

    def __post_init__(self):
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                fail(self, name, "must be in [0, 1]")
        _positive(self, ("vf_coef",), strict=False)
        _positive(self, ("cliprange_value",))
        _choice(self, "kl_estimator", KL_KINDS)


@dataclasses.dataclass(frozen=True)
class DPPOConfig:
    """DPPO, Divergence PPO (--algorithm=dppo; Qi et al. 2026, arXiv 2602.04879; prime-rl's default loss):
    GRPO's group advantages, and instead of the clipped ratio a binary trust region on each sampled token's
    probability against the SAMPLER's (a token whose probability moved past the threshold in the direction
    of its advantage is dropped from the policy term) plus kl_coef x (log π − log μ)² on every token
    (grpo_jax.core.surrogates.dppo). The defaults are prime-rl's (DefaultLossConfig)."""

    FLAG_PREFIX: ClassVar[str] = "dppo_"
    mask_low: float = opt(
        0.2, "--algorithm=dppo: δ_low: drop a token with A ≤ 0 whose probability fell by more than this."
    )
    mask_high: float = opt(
        0.2, "--algorithm=dppo: δ_high: drop a token with A > 0 whose probability rose by more than this."
    )
    divergence: str = opt(
        "tv",
        "--algorithm=dppo: the per-token divergence the thresholds apply to: tv (|π − μ|, prime-rl) or kl "
        "(the Bernoulli KL of the sampled token vs the rest, verl dppo_kl / SkyRL binary_kl; use smaller "
        "thresholds, e.g. 0.05).",
        choices=DPPO_DIVERGENCES,
    )
    kl_coef: float = opt(
        1e-3,
        "--algorithm=dppo: coefficient of (log π − log μ_sampler)² on every valid token (prime-rl kl_tau); "
        "0 = off.",
    )

    def __post_init__(self):
        _positive(self, ("mask_low", "mask_high", "kl_coef"), strict=False)
        _choice(self, "divergence", DPPO_DIVERGENCES)


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """The objective: the algorithm, advantages, baseline, coefficients, reference updates, reward shaping.

    The defaults are canonical GRPO (DeepSeekMath: z-score advantages, k3 KL to a frozen π_ref with β = 0.04,
    clip 0.2, seq-mean-token-mean); published recipes are named in grpo_jax.presets. algorithm="ppo" replaces
    the group-relative advantages by a critic's (PPOConfig) on the same rollout.
    """

    FLAG_PREFIX: ClassVar[str] = ""
    algorithm: str = opt(
        "grpo",
        "grpo (group-relative advantages, no critic), ppo (token-level PPO: a value head on the policy "
        "transformer's shared trunk as the critic, KL-shaped per-token rewards with the sandbox reward on "
        "the last token, GAE; the same rollout of prompts_per_step x group_size completions; --ppo_* "
        "flags) or dppo (GRPO's advantages with DPPO's trust region on token probabilities against the "
        "sampler instead of the clipped ratio, prime-rl's default loss; --dppo_* flags).",
        choices=ALGORITHMS,
    )
    ppo: PPOConfig = PPOConfig()
    dppo: DPPOConfig = DPPOConfig()
    adv_method: str = opt(
        "grpo",
        "Advantage estimator: grpo (z-score), dr_grpo (mean only), rloo, batch_std.",
        choices=GROUP_ADV_METHODS,
    )
    adv_ddof: int = opt(1, "ddof of the group std (TRL: 1).")
    adv_eps: float = opt(1e-4, "eps added to the group std (TRL: 1e-4).")
    baseline: str = opt(
        "group",
        "Advantage baseline: group (canonical GRPO), pool (the past-policy pool's mean "
        "reward on the same prompt, scale-only form) or mix (a weighted sum of both).",
        choices=BASELINES,
    )
    baseline_mix: float = opt(0.5, "Weight of the pool baseline in --baseline=mix, in [0, 1].")
    baseline_std_floor: float = opt(1.0, "Advantage scale of all-equal groups under a pool baseline.")
    loss: PolicyLossConfig = PolicyLossConfig()
    kl_coef: float = opt(
        0.04,
        "KL coefficient β of the KL to the reference (the SFT policy); 0 removes the "
        "reference model. With --kl_schedule: β of step 0. With --algorithm=ppo: β of the KL-shaped "
        "per-token reward (no KL term in the loss).",
    )
    kl_schedule: tuple[tuple[int, float], ...] = opt(
        (),
        "Piecewise-constant β by GRPO step, 'step:beta,...' "
        "from step 0 (the seed: 0:0.03,100:0.01,500:0.005).",
    )
    entropy_coef: float = opt(0.0, "Entropy bonus coefficient (initial value if a controller drives it).")
    controller: ControllerConfig = ControllerConfig()
    mask_truncated: bool = opt(False, "Drop completions without EOS from the loss (DAPO overlong filter).")
    overlong_cache_len: int = opt(
        0,
        "DAPO soft overlong punishment: completions longer than max_new_tokens - "
        "this many tokens get a linear penalty down to -1 (0 = off).",
    )
    num_iterations: int = opt(
        1, "Epochs over each rollout batch (μ); μ > 1 moves π_θ off π_old (PPO-style reuse)."
    )
    mini_batches: int = opt(
        1,
        "Optimiser updates per epoch over a rollout batch: its prompts are shuffled and split into this "
        "many mini-batches (TRL steps_per_generation); updates = mini_batches x num_iterations.",
    )
    success_threshold: float = opt(
        1.0, "A sample counts as a success (Performance/SuccessRate) at reward >= this."
    )
    ref_update: str = opt(
        "frozen",
        "Reference policy updates: frozen, hard (π_ref ← π_θ every N steps, R1) or "
        "ema (π_ref ← π_ref + τ(π_θ − π_ref)); needs a KL to the reference.",
        choices=REF_UPDATES,
    )
    ref_update_every: int = opt(1, "Reference update period in GRPO steps (hard reset or EMA step).")
    ref_ema_tau: float = opt(0.005, "EMA rate τ of --ref_update=ema (the seed: 0.005).")
    multiscale_w_tests: float = opt(0.0, "Weight of the per-test sub-goal advantage (0 = off).")
    multiscale_mode: str = opt(
        "mean_of_tests", "Per-test advantage form: mean_of_tests or fraction.", choices=MULTISCALE_MODES
    )

    def __post_init__(self):
        _choice(self, "adv_method", GROUP_ADV_METHODS)
        if self.adv_ddof not in (0, 1):
            fail(self, "adv_ddof", "valid: 0 or 1")
        _positive(
            self,
            ("adv_eps", "kl_coef", "entropy_coef", "multiscale_w_tests", "overlong_cache_len"),
            strict=False,
        )
        _choice(self, "baseline", BASELINES)
        if self.baseline != "group" and self.adv_method != "grpo":
            fail(self, "baseline", "a pool baseline uses the group-std scale: it needs adv_method=grpo")
        if not 0 <= self.baseline_mix <= 1:
            fail(self, "baseline_mix", "must be in [0, 1]")
        _positive(self, ("baseline_std_floor",))
        _choice(self, "ref_update", REF_UPDATES)
        _choice(self, "multiscale_mode", MULTISCALE_MODES)
        if self.ref_update_every < 1:
            fail(self, "ref_update_every", "must be an integer >= 1")
        if not 0 < self.ref_ema_tau <= 1:
            fail(self, "ref_ema_tau", "must be in (0, 1]")
        if self.num_iterations < 1:
            fail(self, "num_iterations", "must be an integer >= 1")
        _positive(self, ("mini_batches",))
        _schedule_ok(self, "kl_schedule", "0:0.03,100:0.01,500:0.005")
        if any(v < 0 for _, v in self.kl_schedule):
            fail(self, "kl_schedule", "every β must be >= 0")
        if self.kl_schedule and self.kl_schedule[0][1] != self.kl_coef:
            fail(self, "kl_schedule", f"its step-0 value must equal kl_coef={self.kl_coef} (β of step 0)")
        if self.kl_schedule and self.controller.drives == "kl_coef":
            fail(
                self, "kl_schedule", f"cannot be combined with controller {self.controller.kind!r} on kl_coef"
            )
        c = self.controller
        if c.kind in _MULTIPLICATIVE and c.drives is not None and getattr(self, c.drives) == 0:
            fail(self, c.drives, f"controller {c.kind!r} scales its coefficient: it needs a start value > 0")
        if self.loss.kl_anchor == "old" and self.num_iterations == 1:
            fail(
                self,
                "loss.kl_anchor",
                "with num_iterations=1 (μ = 1) π_old = sg(π_θ), so the KL to π_old is 0 "
                "in value (and, for k2/k3, in gradient; k1 leaves only a mean-zero score term): use "
                "kl_anchor=ref, or num_iterations > 1",
            )
        if self.ref_update != "frozen" and not self.uses_reference:
            fail(self, "ref_update", "moving the reference needs a KL to it (kl_coef > 0, kl_anchor=ref)")
        _choice(self, "algorithm", ALGORITHMS)
        if self.algorithm == "ppo":
            self._check_ppo()
        if self.algorithm == "dppo":
            self._check_dppo()
        _check_sub_settings(self, "objective")

    def _check_ppo(self) -> None:
        """What --algorithm=ppo cannot be combined with: group-relative advantage machinery, and a KL form
        other than the KL-shaped reward against π_ref."""
        why = "with --algorithm=ppo the advantages are GAE over tokens from the value head"
        if self.adv_method != "grpo":
            fail(self, "adv_method", f"{why}, not a group estimator: leave it at grpo (unused)")
        if self.baseline != "group":
            fail(self, "baseline", f"{why}, not a pool baseline: use group (unused)")
        if self.multiscale_w_tests > 0:
            fail(self, "multiscale_w_tests", f"{why}: multi-scale group advantages do not apply, use 0")
        if self.loss.kl_anchor != "ref":
            fail(
                self,
                "loss.kl_anchor",
                "with --algorithm=ppo the KL is a per-token reward against π_ref: use ref",
            )
        if self.loss.importance_level != "token":
            fail(
                self,
                "loss.importance_level",
                "with --algorithm=ppo every token has its own advantage and ratio: use token",
            )

    def _check_dppo(self) -> None:
        """What --algorithm=dppo cannot be combined with: another policy term, or an IS correction on top of
        a ratio that is already to the sampler."""
        why = (
            "with --algorithm=dppo the policy term is DPPO's (a trust region on probabilities vs the sampler)"
        )
        if self.loss.objective != "clip":
            fail(self, "loss.objective", f"{why}: leave --objective at clip (unused)")
        if self.loss.importance_level != "token":
            fail(self, "loss.importance_level", f"{why}, per token: use token")
        if self.loss.tis_enabled:
            fail(
                self,
                "loss.tis_cap" if self.loss.tis_cap is not None else "loss.tis_min",
                "DPPO's ratio is already π_θ / π_sampler: IS correction on top would weight twice: drop it",
            )

    @property
    def uses_kl(self) -> bool:
        """Whether the run has a KL penalty (a β that can be > 0: kl_coef, the schedule, a KL controller)."""
        beta = self.kl_coef > 0 or any(v > 0 for _, v in self.kl_schedule)
        return beta or self.controller.drives == "kl_coef"

    @property
    def uses_reference(self) -> bool:
        """Whether a reference model is needed (a KL to π_ref whose coefficient can be > 0)."""
        return self.loss.kl_anchor == "ref" and self.uses_kl

    @property
    def uses_entropy_bonus(self) -> bool:
        """Whether the loss has an entropy bonus (a coefficient that can be > 0)."""
        return self.entropy_coef > 0 or self.controller.drives == "entropy_coef"


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with global-norm gradient clipping and linear warm-up; non-finite updates are skipped."""

    FLAG_PREFIX: ClassVar[str] = ""
    learning_rate: float = opt(1e-4, "GRPO AdamW learning rate.")
    warmup_steps: int = opt(0, "Linear learning-rate warm-up steps.")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    grad_clip: float = opt(1.0, "Global gradient-norm clip.")
    b1: float = opt(0.9, "Adam β1.", flag="adam_b1")
    b2: float = opt(0.999, "Adam β2.", flag="adam_b2")
    eps: float = opt(1e-8, "Adam ε.", flag="adam_eps")
    max_consecutive_nonfinite: int = opt(
        1000, "Non-finite gradients skipped in a row before the run stops updating (optax.apply_if_finite)."
    )
    micro_batches: int = opt(
        1,
        "Gradient accumulation: each update's (mini-)batch is processed in this many micro-batches, "
        "normalised by the whole batch's sequence / token counts (the same update, less memory).",
    )
    pack_tokens: int = opt(
        0,
        "The padding-free update (grpo_jax.policies.packed): each prompt encoded once for its group, and the "
        "group's completions (whole multi-turn trajectories) packed back to back into rows of this many "
        "tokens that attend to that prompt, attention masked per completion; the loss, gradient and metrics "
        "are the padded update's to float rounding. 0 = the padded update. Must hold the longest completion "
        "(>= max_turns * max_new_tokens + (max_turns - 1) * feedback_tokens); not with --mini_batches > 1. "
        "When to use it: docs/ROLLOUT_ENGINES.md.",
    )
    pack_rows_per_doubling: int = opt(
        2,
        "The packed update's row counts: exact up to 2k rows, then k sizes per doubling (k = 2: 1, 2, 3, 4, "
        "6, 8, 12, 16, 24, ..). Each row count the steps need is one compilation of the train step: a larger "
        "k computes fewer empty rows and compiles more often (8 suits a model whose step costs far more than "
        "a compile, e.g. SmolLM2 at 512 new tokens; 2 a model that compiles in seconds and steps in less).",
    )

    def __post_init__(self):
        _positive(
            self,
            (
                "learning_rate",
                "grad_clip",
                "eps",
                "max_consecutive_nonfinite",
                "micro_batches",
                "pack_rows_per_doubling",
            ),
        )
        _positive(self, ("weight_decay", "warmup_steps", "pack_tokens"), strict=False)
        for n in ("b1", "b2"):
            if not 0 <= getattr(self, n) < 1:
                fail(self, n, "must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How a step's batch is made: B prompts, G completions each, sampling, refills, async grading."""

    FLAG_PREFIX: ClassVar[str] = ""
    prompts_per_step: int = opt(8, "Prompts per GRPO step (B).")
    group_size: int = opt(8, "Completions per prompt (G).")
    max_new_tokens: int = opt(
        24, "Completion length in tokens (also the SFT target length and Dr. GRPO's L)."
    )
    temperature: float = opt(1.0, "Sampling temperature of training rollouts.")
    top_k: int = opt(
        0,
        "Top-k of training rollouts (0 = off). The sampler's behaviour log-probs are those of the truncated, "
        "renormalised distribution it draws from, so --tis_cap corrects for the truncation (without it the "
        "truncation bias is uncorrected); the trainer's π_θ is the untruncated softmax(logits / "
        "temperature), and logp_mismatch includes the gap −log(kept mass).",
    )
    top_p: float = opt(
        1.0,
        "Top-p of training rollouts (1 = off; the nucleus is taken under softmax(logits / temperature)). As "
        "with --top_k, the behaviour log-probs are the truncated distribution's: --tis_cap corrects for it.",
    )
    rollout_dtype: str = opt(
        "float32",
        "Weights and compute dtype of the training rollouts' sampler. float32: the policy's own numerics "
        "(the sampler's log-probs equal the trainer's to rounding). bfloat16: the weights are cast once per "
        "rollout and decoding reads half the bytes (1.7x the SmolLM2 generation rate on CPU); the behaviour "
        "policy then differs from the trained policy by bf16 rounding, as an inference engine's rollouts do: "
        "logp_mismatch measures it and --tis_cap corrects for it. Evaluation samples the policy as it is "
        "(--compute_dtype: a bfloat16 policy from its bf16 weight copy), never in the rollout dtype.",
        choices=ROLLOUT_DTYPES,
    )
    engine: str = opt(
        "static",
        "The rollout engine of training, evaluation and multi-turn alike (grpo_jax.rollout.engines). static: "
        "one compiled batch of all B x G rows that decodes until its longest reply ends. continuous: "
        "continuous batching, --engine_slots decode slots refilled from the queue of samples as replies "
        "end, the running slots moved into smaller batches once nothing is pending (for replies whose "
        "lengths spread widely; a sample's tokens depend on its own key only). Measured figures and when "
        "to use which: docs/ROLLOUT_ENGINES.md.",
        flag="rollout_engine",
        choices=ROLLOUT_ENGINES,
    )
    engine_slots: int = opt(
        32, "With --rollout_engine=continuous: the most decode slots (samples decoded at once)."
    )
    engine_chunk: int = opt(
        16,
        "With --rollout_engine=continuous: decode steps per device call, between which ended samples' slots "
        "are refilled (a slot whose reply ends idles for the rest of the chunk).",
    )
    dynamic_sampling: bool = opt(False, "DAPO dynamic sampling: refill groups whose rewards are all equal.")
    dynamic_max_rounds: int = opt(3, "Extra sampling rounds per step for dynamic sampling.")
    async_rewards: bool = opt(
        False,
        "Sample and grade step t+1 while the device trains on step t (one step off-policy; needs --tis_cap).",
    )
    max_turns: int = opt(
        1,
        "Turns per trajectory (multi-turn execution feedback; 1 = one program per sample). After a failed "
        "turn the model sees what its program did on the problem's VISIBLE tests (grpo_jax.codegen.feedback) "
        "and writes the program again, until a turn passes or max_turns are used; the reward is the last "
        "turn's and the loss covers the model's tokens of every turn.",
    )
    feedback_tokens: int = opt(
        128, "The most tokens of one feedback turn (with --max_turns > 1; the message is cut to fit)."
    )
    turn_discount: float = opt(
        1.0,
        "With --max_turns > 1: the reward of a trajectory that ends at turn t is multiplied by "
        "turn_discount^(t-1) (1 = no discount; < 1 prefers passing early).",
    )

    @property
    def completion_len(self) -> int:
        """T of the batch: every turn's reply and every feedback turn between them."""
        return self.max_turns * self.max_new_tokens + (self.max_turns - 1) * self.feedback_tokens

    def __post_init__(self):
        _positive(self, ("prompts_per_step", "max_new_tokens", "temperature", "max_turns", "feedback_tokens"))
        if not 0 < self.turn_discount <= 1:
            fail(self, "turn_discount", "must be in (0, 1]")
        if self.group_size < 2:
            fail(self, "group_size", "must be >= 2 (group-relative advantages need a group)")
        _positive(self, ("top_k", "dynamic_max_rounds"), strict=False)
        if not 0 < self.top_p <= 1:
            fail(self, "top_p", "must be in (0, 1]")
        _choice(self, "rollout_dtype", ROLLOUT_DTYPES)
        _choice(self, "engine", ROLLOUT_ENGINES)
        _positive(self, ("engine_slots", "engine_chunk"))
        _check_sub_settings(self, "rollout")


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """The seed's pool of past policies (grpo_jax.pool): ONE stacked pytree with leading axis `capacity`.

    The K most recent snapshots are active (K from `k_schedule`, data: never recompiles); `eval_members` of
    them sample `samples_per_member` completions of the step's prompts; their mean reward is b_pool(q).
    """

    FLAG_PREFIX: ClassVar[str] = "pool_"
    capacity: int = opt(
        0,
        "Past-policy pool slots K_max (0 = no pool). Only with --baseline=pool|mix: nothing else samples the "
        "members.",
    )
    k_schedule: tuple[tuple[int, int], ...] = opt(
        (),
        "Active pool size by GRPO step, 'step:K,...' from step 0 (e.g. 0:8,100:16,500:32); empty = capacity.",
    )
    push_every: int = opt(10, "Push a snapshot of the policy into the pool every N GRPO steps.")
    eval_members: int = opt(0, "Pool members evaluated per step (0 = all slots).")
    samples_per_member: int = opt(1, "Completions per prompt each evaluated member draws.")
    explore_fraction: float = opt(0.0, "Fraction of pushes made exploration members (the seed: 0.2).")
    explore_mode: str = opt(
        "temperature", "How exploration members explore: temperature or param_noise.", choices=EXPLORE_MODES
    )
    explore_temperature: float = opt(1.5, "Sampling temperature of exploration members.")
    explore_noise: float = opt(
        0.2,
        "Relative parameter-noise scale σ of exploration members (each leaf + σ·RMS(leaf)·N(0, 1)). Measured "
        "on the quickstart model after its SFT, 128 prompts x 8 samples, same sampling key: σ = 0.2 changes "
        "22% of the completions (KL 0.023 nats/token, pass rate 0.459 -> 0.431), about one push period of "
        "GRPO drift (10 quickstart steps: 26%, KL 0.069); the old 0.02 changed 2-3% (KL 0.0003, pass rate "
        "unchanged), a copy of the snapshot in all but name; 0.3: 34%, pass rate 0.392.",
    )

    def __post_init__(self):
        _positive(self, ("capacity", "explore_noise"), strict=False)
        _schedule_ok(self, "k_schedule", "0:8,100:16")
        if any(not 1 <= k <= max(self.capacity, 1) for _, k in self.k_schedule):
            fail(self, "k_schedule", f"every K must be in [1, capacity={self.capacity}]")
        _positive(self, ("push_every", "samples_per_member", "explore_temperature"))
        if not 0 <= self.eval_members <= self.capacity:
            fail(self, "eval_members", f"must be in [0, capacity={self.capacity}] (0 = all slots)")
        if not 0 <= self.explore_fraction <= 1:
            fail(self, "explore_fraction", "must be in [0, 1]")
        _choice(self, "explore_mode", EXPLORE_MODES)
        _check_sub_settings(self, "pool")

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    @property
    def members_per_step(self) -> int:
        return self.eval_members or self.capacity

    def k_at(self, step: int) -> int:
        """Active pool size at GRPO step `step` (piecewise constant; capacity without a schedule)."""
        k = self.capacity
        for s, kk in self.k_schedule:
            if step >= s:
                k = kk
        return k


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Train LoRA adapters only (Hu et al. 2021), the base frozen; rank 0 = full fine-tuning. The reference
    policy is then the base (initial adapters have B = 0) and a policy pool stores adapters only."""

    FLAG_PREFIX: ClassVar[str] = "lora_"
    rank: int = opt(0, "LoRA rank (0 = full fine-tuning).")
    alpha: float = opt(16.0, "LoRA alpha (scale alpha / rank).")
    targets: tuple[str, ...] = opt(LORA_TARGETS, "Projections that get adapters.")

    def __post_init__(self):
        _positive(self, ("rank",), strict=False)
        _positive(self, ("alpha",))
        if not self.targets or any(t not in LORA_TARGETS for t in self.targets):
            fail(self, "targets", f"a non-empty subset of {', '.join(LORA_TARGETS)}")
        _check_sub_settings(self, "lora")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """Prioritized replay of successes (grpo_jax.replay): for `fraction`·B prompts the G-th member is a
    stored success of a rarely solved problem, priority (1 − s(q) + 0.01)^alpha (off-policy: --tis_cap)."""

    FLAG_PREFIX: ClassVar[str] = "replay_"
    fraction: float = opt(0.0, "Fraction of prompts whose G-th member is a replayed success (0 = off).")
    capacity: int = opt(1024, "Replay buffer capacity.")
    alpha: float = opt(1.0, "Replay priority exponent: (1 - s(q) + 0.01) ** alpha.")

    def __post_init__(self):
        if not 0 <= self.fraction < 1:
            fail(self, "fraction", "must be in [0, 1)")
        _positive(self, ("capacity",))
        _positive(self, ("alpha",), strict=False)
        _check_sub_settings(self, "replay")

    @property
    def enabled(self) -> bool:
        return self.fraction > 0


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """Curriculum hyper-parameters (grpo_jax.curriculum has the rules; hashable: a static jit argument).

    kind: uniform | levels | pass_rate | levels+pass_rate; P(q) ∝ [level unlocked] · max(1 − s(q), floor).
    """

    FLAG_PREFIX: ClassVar[str] = "curriculum_"
    kind: str = opt(
        "uniform",
        "Problem sampling: uniform, levels (unlock by pass-rate thresholds), pass_rate "
        "(P(q) ~ max(1 - s(q), floor), Kimi k1.5) or levels+pass_rate.",
        flag="curriculum",
        choices=CURRICULUM_KINDS,
    )
    ema: float = opt(0.9, "EMA factor of the per-problem / per-level pass rates, in [0, 1).")
    floor: float = opt(0.05, "Floor of 1 - s(q) in the pass-rate sampling weights, in (0, 1].")
    prior: float = opt(0.0, "s(q) of a never-attempted problem (and the initial level rates), in [0, 1].")
    start_level: int = opt(0, "Highest unlocked level at the start (an index into --rl_levels).")
    promote: float = opt(0.6, "Unlock the next level when the top level's pass rate >= this.")
    demote: float = opt(0.1, "Lock the top level again when its pass rate < this.")
    min_attempts: int = opt(32, "Samples on a level before it may be promoted / demoted.")

    def __post_init__(self):
        _choice(self, "kind", CURRICULUM_KINDS)
        if not 0.0 <= self.ema < 1.0:
            fail(self, "ema", "valid: 0 <= ema < 1")
        if not 0.0 < self.floor <= 1.0:
            fail(self, "floor", "valid: 0 < floor <= 1")
        if not 0.0 <= self.prior <= 1.0:
            fail(self, "prior", "valid: 0 <= prior <= 1")
        if self.start_level < 0:
            fail(self, "start_level", "valid: an integer >= 0 (and < the number of levels)")
        if not 0.0 < self.promote <= 1.0:
            fail(self, "promote", "valid: 0 < promote <= 1 (and > demote)")
        if not 0.0 <= self.demote < self.promote:
            fail(self, "demote", f"valid: 0 <= demote < promote={self.promote}")
        if self.min_attempts < 1:
            fail(self, "min_attempts", "valid: an integer >= 1")

    @property
    def uses_levels(self) -> bool:
        return self.kind in ("levels", "levels+pass_rate")

    @property
    def uses_pass_rate(self) -> bool:
        return self.kind in ("pass_rate", "levels+pass_rate")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: greedy pass@1 and unbiased pass@k from `samples` temperature samples."""

    FLAG_PREFIX: ClassVar[str] = "eval_"
    every: int = opt(0, "Held-out evaluation every N GRPO steps (0 = after SFT and at the end only).")
    samples: int = opt(
        8, "Samples per held-out problem for pass@k (0 = greedy pass@1 only; then --eval_ks=)."
    )
    ks: tuple[int, ...] = opt((1, 8), "k values of pass@k (empty with --eval_samples=0).")
    batch: int = opt(16, "Prompts per evaluation sampler call.")
    mbpp: int = opt(
        0,
        "Also evaluate greedy pass@1 on the first N problems of MBPP's test split (task ids "
        "11-510; 0 = off, 500 = all), reported as mbpp/pass@1.",
    )
    humaneval: bool = opt(
        False, "Also evaluate greedy pass@1 on HumanEval's 164 problems (humaneval/pass@1)."
    )
    max_turns: int = opt(
        0,
        "Turns of the held-out evaluation with execution feedback (turn{t}/pass@k and fix_rate for t = "
        "1..N; 0 = the run's --max_turns). E.g. 2 with --max_turns=1: does a single-turn policy use "
        "feedback? (Uses --feedback_tokens.)",
    )

    def __post_init__(self):
        _positive(self, ("every", "max_turns"), strict=False)
        _positive(self, ("batch",))
        _positive(self, ("samples",), strict=False)
        if not 0 <= self.mbpp <= 500:
            fail(self, "mbpp", "must be in [0, 500] (the size of MBPP's test split)")
        if self.samples == 0 and self.ks:
            fail(self, "ks", "must be empty with samples=0 (greedy pass@1 only)")
        if self.samples and (not self.ks or any(not 1 <= k <= self.samples for k in self.ks)):
            fail(self, "ks", f"every k must be in [1, samples={self.samples}]")


TIME_LIMITS = ("reference", "fixed")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """The code-reward executor (grpo_jax.sandbox): worker slots and per-program limits."""

    FLAG_PREFIX: ClassVar[str] = "sandbox_"
    workers: int = opt(2, "Sandbox worker slots.")
    wall_s: float = opt(
        2.0,
        "Wall-clock limit per program (seconds; caps the per-problem limits); the CPU limit is its ceiling.",
    )
    deadline_s: float = opt(120.0, "Deadline for one batch of programs (seconds).")
    time_limits: str = opt(
        "reference",
        "Per-problem wall limits: 'reference' = min(--sandbox_wall_s, max(floor, factor x the reference "
        "solution's measured seconds)), measured once and cached (grpo_jax.codegen.timelimits); 'fixed' = "
        "--sandbox_wall_s for every problem.",
        choices=TIME_LIMITS,
    )
    time_limit_floor_s: float = opt(
        0.5, "With --sandbox_time_limits=reference: the smallest limit (seconds)."
    )
    time_limit_factor: float = opt(
        5.0, "With --sandbox_time_limits=reference: the multiple of the reference time."
    )
    stop_on_failure: bool = opt(
        False,
        "Run a program's tests only up to its first failure (rewards and pass@k are the same: they need all "
        "tests to pass; faster on problems with many hidden tests); the per-test results then lack the "
        "tests after it, so --multiscale_w_tests > 0 refuses it.",
    )

    def __post_init__(self):
        _positive(self, ("workers", "wall_s", "deadline_s", "time_limit_floor_s", "time_limit_factor"))
        _choice(self, "time_limits", TIME_LIMITS)
        _check_sub_settings(self, "sandbox")

    @property
    def cpu_s(self) -> int:
        return max(1, int(self.wall_s + 0.999))


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints of the whole run state (also after SFT, at the end and on SIGTERM/SIGINT)."""

    FLAG_PREFIX: ClassVar[str] = "checkpoint_"
    every: int = opt(25, "Checkpoint every N GRPO steps (0 = only after SFT, at the end and on a signal).")
    keep: int = opt(2, "Checkpoints kept.", flag="keep_checkpoints")
    export_hf: bool = opt(
        False,
        "At the end, also write the policy as a Hugging Face directory (workdir/hf: "
        "config.json, model.safetensors, tokenizer files; LoRA adapters merged) for "
        "transformers / vLLM. On demand: python -m experiments.export.",
        flag="export_hf",
    )

    def __post_init__(self):
        _positive(self, ("every",), strict=False)
        _positive(self, ("keep",))


@dataclasses.dataclass(frozen=True)
class LogConfig:
    FLAG_PREFIX: ClassVar[str] = ""
    every: int = opt(
        1, "Console line and histograms every N steps (scalars are logged every step).", flag="log_every"
    )
    sample_every: int = opt(10, "Log sample completions every N steps (0 = never).", flag="sample_log_every")

    def __post_init__(self):
        _positive(self, ("every",))
        _positive(self, ("sample_every",), strict=False)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The device mesh of the run (grpo_jax.runtime.sharding): named axes data x fsdp x tensor over every
    device of every process. The rollout batch is split over data x fsdp (a group never straddles devices);
    parameters, optimizer moments and the reference are sharded over fsdp (ZeRO-3 style: each leaf's largest
    divisible dimension) and tensor (Megatron: q/k/v/gate/up by columns, o/down by rows). The product must
    equal the global device count (checked when the run starts, where the devices are known)."""

    FLAG_PREFIX: ClassVar[str] = "mesh_"
    data: int = opt(-1, "Data-parallel axis size (-1 = every device not used by the fsdp and tensor axes).")
    fsdp: int = opt(1, "Parameter-sharding (FSDP / ZeRO-3) axis size; also splits the batch.")
    tensor: int = opt(1, "Tensor-parallel (Megatron) axis size.")
    cpu_devices: int = opt(
        0,
        "CPU backend only: split this process's cores into N JAX devices (jax_num_cpu_devices), so the "
        "mesh runs N shards side by side; 0 = JAX's default (one device, or "
        "--xla_force_host_platform_device_count). Pays off where single-threaded small ops dominate (the "
        "tiny model's sampler), not on SmolLM2.",
    )

    def __post_init__(self):
        _positive(self, ("fsdp", "tensor"))
        _positive(self, ("cpu_devices",), strict=False)
        if self.data != -1 and self.data < 1:
            fail(self, "data", "must be >= 1, or -1 for every device not used by fsdp x tensor")


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How this process runs, not what it computes (results do not depend on it)."""

    FLAG_PREFIX: ClassVar[str] = ""
    compilation_cache: str = opt(
        "",
        "JAX's persistent compilation cache directory (grpo_jax.runtime.compile_cache): empty = "
        "$GRPO_JAX_CACHE_DIR/xla or ~/.cache/grpo_jax/xla; 'none' = off. A second run of the same "
        "configuration loads its compiled steps instead of recompiling.",
    )


DIST_CLUSTERS = ("none", "auto")


@dataclasses.dataclass(frozen=True)
class DistConfig:
    """Multi-process / multi-host runs on JAX's own runtime (jax.distributed; grpo_jax.runtime.distributed).
    One process per host (or per accelerator); every process runs the same program (SPMD), grades its own
    rows of the batch in its own sandbox, and process 0 writes the logs. CPU collectives use gloo."""

    FLAG_PREFIX: ClassVar[str] = "dist_"
    cluster: str = opt(
        "none",
        "none: one process unless --dist_coordinator is given; auto: jax.distributed.initialize() "
        "detects the cluster (SLURM, TPU VM pods, Kubernetes, Open MPI).",
        choices=DIST_CLUSTERS,
    )
    coordinator: str = opt(
        "", "Coordinator HOST:PORT (process 0's address) for an explicit multi-process run."
    )
    num_processes: int = opt(1, "Processes in an explicit multi-process run (with --dist_coordinator).")
    process_id: int = opt(0, "This process's index, 0 .. num_processes - 1 (with --dist_coordinator).")
    init_timeout_s: int = opt(300, "Seconds to wait for every process to join at start-up.")
    heartbeat_s: int = opt(
        60, "JAX's heartbeat timeout: a process silent this long (dead, or its host lost) ends the run."
    )
    step_timeout_s: int = opt(
        1800,
        "Every GRPO step starts at a barrier: a process that does not reach it within this many "
        "seconds (hung) ends the run with an error naming it.",
    )

    def __post_init__(self):
        _choice(self, "cluster", DIST_CLUSTERS)
        _positive(self, ("num_processes", "init_timeout_s", "heartbeat_s", "step_timeout_s"))
        if self.coordinator:
            host, _, port = self.coordinator.rpartition(":")
            if not host or not port.isdigit():
                fail(self, "coordinator", "must be HOST:PORT, e.g. 10.0.0.1:1234")
            if self.cluster == "auto":
                fail(
                    self,
                    "coordinator",
                    "give either --dist_cluster=auto or an explicit coordinator, not both",
                )
            if not 0 <= self.process_id < self.num_processes:
                fail(self, "process_id", f"must be in 0..{self.num_processes - 1} (num_processes)")
        elif self.num_processes != 1 or self.process_id != 0:
            which = "num_processes" if self.num_processes != 1 else "process_id"
            fail(self, which, "needs --dist_coordinator=HOST:PORT (or --dist_cluster=auto)")

    @property
    def enabled(self) -> bool:
        return bool(self.coordinator) or self.cluster == "auto"


# ------------------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------------------

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
    "rollout.max_new_tokens",
)
SFT_INPUTS_EXCLUDED = ("model.logp_chunk",)  # GRPO's chunked head only: SFT computes full logits
# what only matters when SFT runs: refused next to a pretrained model's no-SFT default (RunConfig)
_SFT_SETTINGS = ("sft.batch", "sft.lr", "sft.warmup_steps", "tasks.sft_levels")


def is_sft_input(path: str) -> bool:
    """Whether the dotted config path is one of SFT_INPUTS (a field that decides the post-SFT parameters)."""
    return path not in SFT_INPUTS_EXCLUDED and any(
        path == k or (k.endswith(".") and path.startswith(k)) for k in SFT_INPUTS
    )


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The whole run of `python -m experiments.codegen` (grpo_jax.train.loop.run)."""

    FLAG_PREFIX: ClassVar[str] = ""
    workdir: str = opt("", "Run directory: checkpoints, TensorBoard events, metrics.jsonl, results.json.")
    seed: int = opt(0, "Seed of the task suite, the model init and every PRNG stream.")
    resume: bool = opt(
        True,
        "Resume from the workdir's newest intact checkpoint if there is one (a corrupt newer step, whose "
        "files differ from the checksums recorded when it was saved, is reported and skipped).",
    )
    resume_from: int | None = opt(
        None,
        "Resume from this checkpoint step of the workdir (none = the newest intact one); a step that is not "
        "there or is corrupt is an error listing the intact steps.",
    )
    steps: int = opt(50, "GRPO steps.")
    preset: str = opt(
        "",
        "Objective preset applied (grpo_jax.presets); on the command line it takes effect "
        "where it appears: flags after it override it, flags before it are overridden (noted).",
    )
    model: ModelConfig = ModelConfig()
    tasks: TaskConfig = TaskConfig()
    sft: SFTConfig = SFTConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    optim: OptimConfig = OptimConfig()
    rollout: RolloutConfig = RolloutConfig()
    pool: PoolConfig = PoolConfig()
    lora: LoRAConfig = LoRAConfig()
    replay: ReplayConfig = ReplayConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    eval: EvalConfig = EvalConfig()
    sandbox: SandboxConfig = SandboxConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()
    mesh: MeshConfig = MeshConfig()
    dist: DistConfig = DistConfig()
    runtime: RuntimeConfig = RuntimeConfig()

    def __post_init__(self):
        if not self.workdir.strip():
            fail(self, "workdir", "a run directory is required")
        _positive(self, ("steps",), strict=False)
        if self.resume_from is not None and self.resume_from < 0:
            fail(self, "resume_from", "must be >= 0 (a checkpoint step), or none for the newest intact one")
        if self.sft.steps is None and self.model.init_from:  # the no-SFT default would silently ignore them
            for path in _SFT_SETTINGS:
                if get_path(self, path) != _field_default(self, path):
                    fail(
                        self,
                        path,
                        "a pretrained model (--init_from) gets no SFT unless --sft_steps is given: give "
                        "--sft_steps=N for an SFT warm start, or drop it",
                    )
        self._derive()  # the checks below see the resolved values
        if self.sft.from_workdir and self.dist.enabled:
            fail(self, "sft.from_workdir", "one process only (not with --dist_*: untested there)")
        obj, ro = self.objective, self.rollout
        n_rl = self.tasks.train_per_level * len(self.tasks.rl_levels)
        if ro.prompts_per_step > n_rl:
            fail(self, "rollout.prompts_per_step", f"must not exceed the {n_rl} RL training problems")
        split = obj.mini_batches * self.optim.micro_batches
        if ro.prompts_per_step % split:
            fail(
                self,
                "optim.micro_batches",
                f"mini_batches x micro_batches = {obj.mini_batches} x {self.optim.micro_batches} must divide "
                f"prompts_per_step={ro.prompts_per_step} (the batch is split by prompts, groups stay whole)",
            )
        if self.replay.enabled and self.replay.capacity < ro.prompts_per_step:
            fail(self, "replay.capacity", f"must be >= prompts_per_step={ro.prompts_per_step}")
        # DPPO's ratio and trust region are to the sampler already: off-policy samples need nothing more
        if (self.replay.enabled or ro.async_rewards) and not obj.loss.tis_enabled and obj.algorithm != "dppo":
            which = "replay.fraction" if self.replay.enabled else "rollout.async_rewards"
            fail(
                self,
                which,
                "replayed and asynchronous rollouts are off-policy: set the truncated "
                "importance-sampling cap objective.loss.tis_cap (e.g. 2)",
            )
        if obj.baseline != "group" and not self.pool.enabled:
            fail(self, "objective.baseline", "needs a policy pool (pool.capacity > 0)")
        if obj.algorithm == "ppo" and self.lora.enabled:
            fail(
                self,
                "lora.rank",
                "--algorithm=ppo trains a value head on the policy, which LoRA would leave frozen in the "
                "base (zero): use lora_rank=0 (full fine-tuning) with PPO",
            )
        if obj.algorithm == "ppo" and ro.dynamic_sampling:
            fail(
                self,
                "rollout.dynamic_sampling",
                "DAPO's filter drops groups whose rewards are all equal (no GRPO gradient), but PPO learns "
                "from them (critic, KL-shaped rewards) and its refills would break the compute match with "
                "GRPO: drop it with --algorithm=ppo",
            )
        if ro.max_turns > 1:
            self._check_multi_turn()
        self._check_engines()
        if self.sandbox.stop_on_failure and obj.multiscale_w_tests > 0:
            fail(
                self,
                "sandbox.stop_on_failure",
                f"multi-scale advantages (--multiscale_w_tests={obj.multiscale_w_tests}) need every test's "
                "result: drop one of them",
            )
        if self.curriculum.start_level >= len(self.tasks.rl_levels):
            fail(
                self,
                "curriculum.start_level",
                f"an index into rl_levels (0..{len(self.tasks.rl_levels) - 1})",
            )
        if obj.overlong_cache_len and obj.overlong_cache_len >= ro.max_new_tokens:
            fail(
                self,
                "objective.overlong_cache_len",
                f"must be < max_new_tokens={ro.max_new_tokens} (DAPO: "
                "L_cache 4096 of L_max 20480; scale it to the max completion length)",
            )
        _check_sub_settings(self, "")

    def _check_engines(self) -> None:
        """--rollout_engine=continuous and --pack_tokens: what they cannot do is refused, one line each."""
        ro, width = self.rollout, self.optim.pack_tokens
        if ro.engine == "continuous" and self.dist.enabled:
            fail(
                self,
                "rollout.engine",
                "the continuous engine runs in one process (its host loop reads every slot): use "
                "--rollout_engine=static with --dist_*",
            )
        if width and width < ro.completion_len:
            fail(
                self,
                "optim.pack_tokens",
                "a packed row must hold the longest completion: >= the completion length "
                f"{ro.completion_len} (max_turns * max_new_tokens + (max_turns - 1) * feedback_tokens)",
            )
        if width and self.objective.mini_batches > 1:
            fail(
                self,
                "optim.pack_tokens",
                f"not with mini_batches={self.objective.mini_batches} (the packed layout is planned per "
                "micro-batch; use --pack_tokens=0 or --mini_batches=1)",
            )

    def _check_multi_turn(self) -> None:
        """--max_turns > 1: the mechanisms whose samples are not trajectories are refused, one line each."""
        refuse = [
            (
                "objective.algorithm",
                self.objective.algorithm == "ppo",
                "PPO's critic is not trained on trajectories",
            ),
            ("pool.capacity", self.pool.enabled, "the policy pool samples single-turn completions"),
            ("replay.fraction", self.replay.enabled, "replayed successes are single-turn completions"),
            (
                "dist.num_processes",
                self.dist.enabled,
                "feedback turns are graded in one process only for now",
            ),
        ]
        for path, bad, why in refuse:
            if bad:
                fail(self, path, f"not with --max_turns={self.rollout.max_turns}: {why} (use --max_turns=1)")

    def _derive(self) -> None:
        """The derived fields, in one place: the defaults that depend on the model (AUTO_DEFAULTS: a
        pretrained --init_from model gets no SFT and chat prompts, a model trained from scratch 300 SFT steps
        and plain prompts, unless the field was given), and the loss's max_len (Dr. GRPO's L) =
        max_new_tokens x max_turns (the model's own tokens of a whole trajectory)."""
        pick = 1 if self.model.init_from else 0
        if self.sft.steps is None:
            sft = dataclasses.replace(self.sft, steps=AUTO_DEFAULTS["sft.steps"][pick])
            object.__setattr__(self, "sft", sft)
        if self.tasks.prompt_format == "auto":
            fmt = AUTO_DEFAULTS["tasks.prompt_format"][pick]
            object.__setattr__(self, "tasks", dataclasses.replace(self.tasks, prompt_format=fmt))
        max_len = self.rollout.max_new_tokens * self.rollout.max_turns  # the model's tokens of all turns
        if self.objective.loss.max_len != max_len:
            loss = dataclasses.replace(self.objective.loss, max_len=max_len)
            object.__setattr__(self, "objective", dataclasses.replace(self.objective, loss=loss))

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


SECTIONS = (
    ModelConfig,
    TaskConfig,
    SFTConfig,
    ControllerConfig,
    PPOConfig,
    DPPOConfig,
    ObjectiveConfig,
    PolicyLossConfig,
    OptimConfig,
    RolloutConfig,
    PoolConfig,
    LoRAConfig,
    ReplayConfig,
    CurriculumConfig,
    EvalConfig,
    SandboxConfig,
    CheckpointConfig,
    LogConfig,
    MeshConfig,
    DistConfig,
    RuntimeConfig,
    RunConfig,
)


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def field_types(cls: type) -> dict[str, Any]:
    """{field name: resolved type} of a config dataclass (ClassVars excluded)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


# config fields that changed meaning or went away, for runs saved before the change (migrate_saved)
_LEGACY_VALUES = {"model.remat": {False: "none", True: "full"}}  # a bool before the remat policies
_REMOVED = ("mesh.model",)  # the old model-parallel axis (only 1 was ever valid): now mesh.tensor
# sub-settings (SUB_SETTINGS) whose default or preset value changed since runs were saved (issue 23: the
# exploration noise 0.02 -> 0.2; the TRL presets' inert KL / entropy-bonus forms): where their mechanism was
# off in the saved run the value had no effect, so it reads as today's default and the run still resumes
_INERT_WHEN_OFF = ("pool.explore_noise", "objective.loss.kl_bias_correction", "objective.loss.entropy_bonus")


def flat_dict(d: dict, prefix: str = "") -> dict:
    """A nested dict (RunConfig.to_json(), a saved run.json "config") as {dotted path: leaf value}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_dict(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


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


def _unvalidated(values: dict[str, Any], cls: type, prefix: str = "") -> Any:
    """A config tree of `cls` holding {dotted path: value} as given, without validation (for reading the
    switches of a saved config, whatever it holds)."""
    obj = object.__new__(cls)
    for name, tp in field_types(cls).items():
        path = prefix + name
        v = _unvalidated(values, tp, path + ".") if is_section(tp) else values.get(path)
        object.__setattr__(obj, name, v)
    return obj


def leaves(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted path: value} of every leaf field of a config tree (sections flattened)."""
    out: dict[str, Any] = {}
    for name, tp in field_types(type(cfg)).items():
        v = getattr(cfg, name)
        if is_section(tp):
            out.update(leaves(v, f"{prefix}{name}."))
        else:
            out[prefix + name] = v
    return out


def from_leaves(values: dict[str, Any], cls: type = RunConfig, prefix: str = "") -> Any:
    """Build (and so validate, every section bottom-up, then the cross-section rules) a config tree from
    {dotted path: value}; paths that are absent take the field's default. Unknown paths are a KeyError."""
    if not prefix:
        known = set(leaves(_defaults(cls)))
        unknown = sorted(set(values) - known)
        if unknown:
            raise KeyError(f"unknown config fields: {', '.join(unknown)}")
    kwargs = {}
    for name, tp in field_types(cls).items():
        path = prefix + name
        if is_section(tp):
            kwargs[name] = from_leaves(values, tp, path + ".")
        elif path in values:
            kwargs[name] = values[path]
    return cls(**kwargs)


def _defaults(cls: type) -> Any:
    """An instance of `cls` with default values that skips validation (the root needs a workdir)."""
    obj = object.__new__(cls)
    for name, tp in field_types(cls).items():
        f = cls.__dataclass_fields__[name]
        default = _defaults(tp) if is_section(tp) else f.default
        object.__setattr__(obj, name, default)
    return obj
