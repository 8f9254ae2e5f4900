"""Named objective recipes (GRPO_MATH.md §1.8) as values of the run config.

A preset sets EVERY recipe field (`RECIPE_FIELDS`: the objective's advantage, baseline, clipping, KL, entropy,
controller, reference-update and reward-shaping fields, plus G and DAPO's dynamic sampling) to the recipe's
value — canonical GRPO's where the recipe says nothing — and may set a few extra fields (the seed's pool):

    cfg = get_preset("dapo").apply(cfg)            # a RunConfig with the DAPO objective
    dict(get_preset("r1").values)                  # {"objective.kl_coef": 0.001, ...} dotted paths

Fields a preset does not set (the TIS cap, multi-scale advantages, sizes, learning rate) keep their values.
A preset sets a sub-setting of an optional mechanism only where the recipe turns that mechanism on
(config.SUB_SETTINGS: e.g. the EMA rate only with an EMA reference), so no preset trips that rule; a recipe
value that is inert in the recipe itself (TRL's use_bias_correction_kl at β = 0) is named in its notes.
On the command line `--preset=NAME` takes effect where it appears among the flags (grpo_jax.cli): a flag
after it overrides the preset's value, a flag before it is overridden, and both are printed.
Every preset carries a `notes` string saying where its numbers come from and what was filled in.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from grpo_jax.config import ObjectiveConfig, RunConfig, from_leaves, get_path, leaves

_OBJECTIVE_RECIPE = (
    "adv_method",
    "adv_ddof",
    "adv_eps",
    "baseline",
    "kl_coef",
    "kl_schedule",
    "entropy_coef",
    "mask_truncated",
    "overlong_cache_len",
    "num_iterations",
    "ref_update",
    "ref_update_every",
    "ref_ema_tau",
    "loss.eps_low",
    "loss.eps_high",
    "loss.dual_clip",
    "loss.delta",
    "loss.kl_estimator",
    "loss.kl_anchor",
    "loss.kl_bias_correction",
    "loss.aggregation",
    "loss.importance_level",
    "loss.objective",
    "loss.sapo_temp_pos",
    "loss.sapo_temp_neg",
    "loss.vespo_k_pos",
    "loss.vespo_lambda_pos",
    "loss.vespo_k_neg",
    "loss.vespo_lambda_neg",
    "loss.top_entropy_quantile",
    "loss.off_policy_mask_threshold",
    "loss.entropy_bonus",
    *(f"controller.{f.name}" for f in dataclasses.fields(ObjectiveConfig().controller)),
)
RECIPE_FIELDS = (
    *(f"objective.{p}" for p in _OBJECTIVE_RECIPE),
    "rollout.group_size",
    "rollout.dynamic_sampling",
)
_CANONICAL = RunConfig(workdir="-")  # canonical GRPO: the ObjectiveConfig defaults
# TRL's GRPOConfig forms of the KL and the entropy bonus: inert at TRL's β = 0 and entropy coefficient 0, so
# the TRL presets leave them at canonical GRPO's (sub-settings of mechanisms that are off: SUB_SETTINGS)
_TRL_INERT = (
    " TRL's use_bias_correction_kl=True and token-mean entropy bonus act only with β > 0 / an entropy "
    "coefficient (off in the recipe): add --kl_bias_correction with --kl_coef, --entropy_bonus=token_mean "
    "with --entropy_coef."
)


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    notes: str
    values: tuple[tuple[str, Any], ...]  # (dotted RunConfig path, value): every RECIPE_FIELD, then extras

    def apply(self, cfg: RunConfig) -> RunConfig:
        """`cfg` with this preset's values (the whole tree validated once, after all of them are set)."""
        return from_leaves({**leaves(cfg), **dict(self.values)})


def _preset(name: str, notes: str, extra: dict[str, Any] | None = None, **recipe: Any) -> Preset:
    """A preset from canonical GRPO plus `recipe` overrides (keys: paths with '.' written as '__')."""
    given = {k.replace("__", "."): v for k, v in recipe.items()}
    unknown = sorted(set(given) - set(RECIPE_FIELDS))
    if unknown:
        raise ValueError(f"preset {name}: not recipe fields: {unknown}")
    values = [(p, given.get(p, get_path(_CANONICAL, p))) for p in RECIPE_FIELDS]
    values += list((extra or {}).items())
    return Preset(name=name, notes=notes, values=tuple(values))


_PRESETS = (
    _preset(
        "deepseekmath",
        "DeepSeekMath §4.1-4.2: β=0.04 (k3 KL to a frozen π_ref), G=64, seq-mean-token-mean, μ=1; ε not "
        "stated in the paper, 0.2 (PPO/TRL) used; std ddof=1 + eps 1e-4 from TRL.",
        objective__kl_coef=0.04,
        rollout__group_size=64,
    ),
    _preset(
        "r1",
        "DeepSeek-R1 (Nature version) first RL stage: β=0.001, ε=10 (as printed; clipping nearly off), G=16, "
        "π_ref reset to π_θ every 400 steps; ddof/eps from TRL.",
        objective__kl_coef=0.001,
        objective__loss__eps_low=10.0,
        objective__loss__eps_high=10.0,
        objective__ref_update="hard",
        objective__ref_update_every=400,
        rollout__group_size=16,
    ),
    _preset(
        "dapo",
        "DAPO §3-4.1: no KL, clip-higher 0.2/0.28, dynamic sampling, token-mean, overlong filter + soft "
        "punishment with L_cache=4096 of L_max=20480 (L_max = --max_new_tokens here), G=16; ddof/eps from "
        "TRL. DAPO's 16 mini-batch updates per rollout are --mini_batches=16 (with --prompts_per_step a "
        "multiple of 16); the preset leaves 1, so it fits any batch.",
        objective__kl_coef=0.0,
        objective__loss__eps_high=0.28,
        objective__loss__aggregation="token_mean",
        objective__mask_truncated=True,
        objective__overlong_cache_len=4096,
        rollout__group_size=16,
        rollout__dynamic_sampling=True,
    ),
    _preset(
        "dr_grpo",
        "Dr. GRPO (arXiv 2503.20783, sail-sg/understand-r1-zero README): no std, constant 1/(G·L) with "
        "L = the max completion length (3000 there; --max_new_tokens here), β=0, G=8; ε=0.2 (PPO/TRL).",
        objective__adv_method="dr_grpo",
        objective__adv_eps=0.0,
        objective__kl_coef=0.0,
        objective__loss__aggregation="constant",
        rollout__group_size=8,
    ),
    _preset(
        "gspo",
        "GSPO (arXiv 2507.18071 via TRL paper index): sequence ratio, ε 3e-4/4e-4, β=0, one term per "
        "sequence; G not stated in GRPO_MATH, TRL's default 8 used.",
        objective__kl_coef=0.0,
        objective__loss__eps_low=3e-4,
        objective__loss__eps_high=4e-4,
        objective__loss__aggregation="seq_mean",
        objective__loss__importance_level="sequence",
        rollout__group_size=8,
    ),
    _preset(
        "trl_default",
        "TRL 1.16 GRPOConfig defaults (grpo_config.py): β=0, ε=0.2 both sides, loss_type 'dapo' (token-mean "
        "over the batch's tokens), scale_rewards 'group' (std ddof 1 + 1e-4), importance_sampling_level "
        "'token', G=8." + _TRL_INERT,
        objective__kl_coef=0.0,
        objective__loss__aggregation="token_mean",
        rollout__group_size=8,
    ),
    _preset(
        "cispo",
        "CISPO (MiniMax-M1, arXiv 2506.13585; TRL loss_type 'cispo'): −sg(min(ρ, ε_max))·A·logp with "
        "ε_max = 5 (the ScaleRL paper's value, TRL's recommendation), token-mean; the rest TRL's defaults."
        + _TRL_INERT,
        objective__kl_coef=0.0,
        objective__loss__objective="cispo",
        objective__loss__eps_high=5.0,
        objective__loss__aggregation="token_mean",
        rollout__group_size=8,
    ),
    _preset(
        "sapo",
        "SAPO (soft adaptive policy optimisation; TRL loss_type 'sapo'): −σ(τ(ρ−1))·4/τ·A with τ = 1.0 for "
        "A > 0 and 1.05 otherwise (TRL's defaults), seq-mean-token-mean; the rest TRL's defaults."
        + _TRL_INERT,
        objective__kl_coef=0.0,
        objective__loss__objective="sapo",
        rollout__group_size=8,
    ),
    _preset(
        "luspo",
        "LUSPO (TRL loss_type 'luspo'): the clipped objective at the sequence level (TRL warns unless "
        "importance_sampling_level='sequence'), each sequence's sum averaged over sequences; ε=0.2 as TRL."
        + _TRL_INERT,
        objective__kl_coef=0.0,
        objective__loss__importance_level="sequence",
        objective__loss__aggregation="seq_sum_mean",
        rollout__group_size=8,
    ),
    _preset(
        "vespo",
        "VESPO (TRL loss_type 'vespo'): −sg(φ(w))·A·logp, φ(w) = exp(λ + k log w − λw) of the summed "
        "sequence log ratio, k/λ = 2/3 for A ≥ 0 and 3/2 otherwise (TRL's defaults), token-mean."
        + _TRL_INERT,
        objective__kl_coef=0.0,
        objective__loss__objective="vespo",
        objective__loss__aggregation="token_mean",
        rollout__group_size=8,
    ),
    # The seed's advantage is a z-score of (r − pool baseline); the baseline cancels under a z-score (T1b), so
    # its formula computes exactly "grpo". The pool is realised as baseline="pool": the scale-only form.
    _preset(
        "seed",
        "The seed document's own numbers, not from a paper: β=0.01 (its table; as the KL to π_ref), its "
        "adaptive entropy rule driving the entropy bonus (init 0.01, target 2.0), its 'group of historical "
        "policies' K=16 as a pool baseline, τ=0.005 EMA reference; G=8, ε=0.2 and k3 filled in. Its β "
        "schedule 0.03/0.01/0.005 contradicts its table: it is seed.flags' documented change.",
        extra={"pool.capacity": 16},
        objective__kl_coef=0.01,
        objective__entropy_coef=0.01,
        objective__controller__kind="seed_entropy",
        objective__controller__target=2.0,
        objective__baseline="pool",
        objective__ref_update="ema",
        objective__ref_update_every=1,
        objective__ref_ema_tau=0.005,
        rollout__group_size=8,
    ),
)

PRESETS = types.MappingProxyType({p.name: p for p in _PRESETS})
PRESET_NAMES = tuple(PRESETS)


def get_preset(name: str) -> Preset:
    """The named Preset; ValueError listing the valid names otherwise."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets are {', '.join(PRESET_NAMES)}")
    return PRESETS[name]
