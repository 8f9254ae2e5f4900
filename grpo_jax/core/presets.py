"""Named objective presets (GRPO_MATH.md §1.8): advantage + loss + coefficient settings of published recipes.

    preset = get_preset("dapo")
    adv = compute_advantages(rewards, method=preset.adv_method, ddof=preset.adv_ddof, eps=preset.adv_eps)
    loss, aux = grpo_loss(..., cfg=preset.loss, kl_coef=preset.kl_coef, entropy_coef=preset.entropy_coef)

Every preset carries a one-line `notes` string saying where its numbers come from and what was filled in.
"""

from __future__ import annotations

import dataclasses
import types

from grpo_jax.core.advantages import ADV_METHODS
from grpo_jax.core.controllers import CONTROLLER_KINDS
from grpo_jax.core.losses import GRPOLossConfig


@dataclasses.dataclass(frozen=True)
class ObjectivePreset:
    """One named objective. Fields beyond the loss config:

    adv_method / adv_ddof / adv_eps: arguments of `compute_advantages`.
    kl_coef (β, KL to the anchor of loss.kl_anchor) and entropy_coef: initial coefficients (a controller may
        then move them). group_size: G. dynamic_sampling: DAPO's filter of all-equal groups.
    overlong: (max_len, cache_len) for DAPO soft overlong punishment, or None. mask_truncated: DAPO overlong
        filtering (zero the loss of truncated completions). ref_reset_every: π_ref ← π_θ every N
        steps, or None.
    entropy_controller: a `make_controller` kind driving entropy_coef, or None. pool_size: K past-policy
        snapshots (0 = no pool). ref_ema_tau: EMA update rate of π_ref, or None (frozen).
    """

    name: str
    adv_method: str
    adv_ddof: int
    adv_eps: float
    loss: GRPOLossConfig
    kl_coef: float
    entropy_coef: float
    group_size: int
    notes: str
    dynamic_sampling: bool = False
    overlong: tuple[int, int] | None = None
    ref_reset_every: int | None = None
    mask_truncated: bool = False
    entropy_controller: str | None = None
    pool_size: int = 0
    ref_ema_tau: float | None = None

    def __post_init__(self):
        if self.adv_method not in ADV_METHODS:
            raise ValueError(
                f"ObjectivePreset.adv_method must be one of {ADV_METHODS}; got {self.adv_method!r}."
            )
        if self.adv_ddof not in (0, 1):
            raise ValueError(f"ObjectivePreset.adv_ddof must be 0 or 1; got {self.adv_ddof!r}.")
        if not self.adv_eps >= 0:
            raise ValueError(f"ObjectivePreset.adv_eps must be >= 0; got {self.adv_eps!r}.")
        if not isinstance(self.loss, GRPOLossConfig):
            raise ValueError(
                f"ObjectivePreset.loss must be a GRPOLossConfig; got {type(self.loss).__name__}."
            )
        if not self.kl_coef >= 0:
            raise ValueError(f"ObjectivePreset.kl_coef must be >= 0; got {self.kl_coef!r}.")
        if not self.entropy_coef >= 0:
            raise ValueError(f"ObjectivePreset.entropy_coef must be >= 0; got {self.entropy_coef!r}.")
        if not (isinstance(self.group_size, int) and self.group_size >= 2):
            raise ValueError(f"ObjectivePreset.group_size must be an int >= 2; got {self.group_size!r}.")
        if self.overlong is not None:
            ml, cl = self.overlong
            if not (0 < cl < ml):
                raise ValueError(
                    f"ObjectivePreset.overlong must be (max_len, cache_len) with 0 < cache_len < max_len; "
                    f"got {self.overlong!r}."
                )
        if self.ref_reset_every is not None and not self.ref_reset_every > 0:
            raise ValueError(
                f"ObjectivePreset.ref_reset_every must be None or > 0; got {self.ref_reset_every!r}."
            )
        if self.entropy_controller is not None and self.entropy_controller not in CONTROLLER_KINDS:
            raise ValueError(
                f"ObjectivePreset.entropy_controller must be None or one of {CONTROLLER_KINDS}; "
                f"got {self.entropy_controller!r}."
            )
        if not self.pool_size >= 0:
            raise ValueError(f"ObjectivePreset.pool_size must be >= 0; got {self.pool_size!r}.")
        if self.ref_ema_tau is not None and not 0 < self.ref_ema_tau <= 1:
            raise ValueError(
                f"ObjectivePreset.ref_ema_tau must be None or in (0, 1]; got {self.ref_ema_tau!r}."
            )


_PRESETS = (
    ObjectivePreset(
        name="deepseekmath",
        adv_method="grpo",
        adv_ddof=1,
        adv_eps=1e-4,
        loss=GRPOLossConfig(eps_low=0.2, eps_high=0.2, kl_estimator="k3", aggregation="seq_mean_token_mean"),
        kl_coef=0.04,
        entropy_coef=0.0,
        group_size=64,
        notes="DeepSeekMath §4.1-4.2 (β=0.04, G=64, k3, seq-mean-token-mean); ε not stated in the paper, 0.2 "
        "(PPO/TRL) used; std ddof=1 + eps 1e-4 from TRL.",
    ),
    ObjectivePreset(
        name="r1",
        adv_method="grpo",
        adv_ddof=1,
        adv_eps=1e-4,
        loss=GRPOLossConfig(
            eps_low=10.0, eps_high=10.0, kl_estimator="k3", aggregation="seq_mean_token_mean"
        ),
        kl_coef=0.001,
        entropy_coef=0.0,
        group_size=16,
        ref_reset_every=400,
        notes="DeepSeek-R1 (Nature version) first RL stage: β=0.001, ε=10 (as printed; clipping nearly off), "
        "G=16, π_ref reset every 400 steps; ddof/eps from TRL.",
    ),
    ObjectivePreset(
        name="dapo",
        adv_method="grpo",
        adv_ddof=1,
        adv_eps=1e-4,
        loss=GRPOLossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean", max_len=20480),
        kl_coef=0.0,
        entropy_coef=0.0,
        group_size=16,
        dynamic_sampling=True,
        overlong=(20480, 4096),
        mask_truncated=True,
        notes="DAPO §3-4.1: no KL, clip-higher 0.2/0.28, dynamic sampling, token-mean, overlong filter + "
        "soft punishment (20480/4096), G=16; ddof/eps from TRL.",
    ),
    ObjectivePreset(
        name="dr_grpo",
        adv_method="dr_grpo",
        adv_ddof=1,
        adv_eps=0.0,
        loss=GRPOLossConfig(eps_low=0.2, eps_high=0.2, aggregation="constant", max_len=3000),
        kl_coef=0.0,
        entropy_coef=0.0,
        group_size=8,
        notes="Dr. GRPO (arXiv 2503.20783, sail-sg/understand-r1-zero README): no std, constant 1/(G·L_max) "
        "with L_max=3000, β=0, G=8; ε=0.2 (PPO/TRL).",
    ),
    ObjectivePreset(
        name="gspo",
        adv_method="grpo",
        adv_ddof=1,
        adv_eps=1e-4,
        loss=GRPOLossConfig(eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean", importance_level="sequence"),
        kl_coef=0.0,
        entropy_coef=0.0,
        group_size=8,
        notes="GSPO (arXiv 2507.18071 via TRL paper index): sequence ratio, ε 3e-4/4e-4, β=0, one term per "
        "sequence; G not stated in GRPO_MATH, TRL default 8 used.",
    ),
    ObjectivePreset(
        name="trl_default",
        adv_method="grpo",
        adv_ddof=1,
        adv_eps=1e-4,
        loss=GRPOLossConfig(
            eps_low=0.2,
            eps_high=0.2,
            kl_estimator="k3",
            kl_bias_correction=True,
            aggregation="token_mean",
            max_len=512,
        ),
        kl_coef=0.0,
        entropy_coef=0.0,
        group_size=8,
        notes="TRL GRPOConfig defaults (grpo_config.py): β=0, ε=0.2, loss_type 'dapo' (token-mean), G=8, "
        "max_completion_length 512; KL bias correction on as in TRL 1.16 (inert while β=0).",
    ),
    # The seed's advantage is a z-score of (r − pool baseline); the baseline cancels under a z-score (T1b), so
    # its formula computes exactly "grpo". experiments.codegen realises pool_size > 0 as
    # ObjectiveConfig(baseline="pool"): the scale-only form, in which the pool matters.
    ObjectivePreset(
        name="seed",
        adv_method="grpo",
        adv_ddof=1,
        adv_eps=1e-4,
        loss=GRPOLossConfig(eps_low=0.2, eps_high=0.2, kl_estimator="k3", kl_anchor="ref"),
        kl_coef=0.01,
        entropy_coef=0.01,
        group_size=8,
        entropy_controller="seed_entropy",
        pool_size=16,
        ref_ema_tau=0.005,
        notes="The seed document's own numbers, not from a paper: β=0.01 (as KL to π_ref), its adaptive "
        "entropy rule (init 0.01, target 2.0), pool K=16, τ=0.005 EMA reference; G, ε=0.2 and k3 filled in.",
    ),
)

PRESETS = types.MappingProxyType({p.name: p for p in _PRESETS})
PRESET_NAMES = tuple(PRESETS)


def get_preset(name: str) -> ObjectivePreset:
    """Return the named ObjectivePreset; ValueError listing the valid names otherwise."""
    if name not in PRESETS:
        raise ValueError(f"get_preset: unknown preset {name!r}; valid presets are {PRESET_NAMES}.")
    return PRESETS[name]
