"""--algorithm=dppo: Divergence PPO (grpo_jax.algorithms.dppo). Its config in one place: the section of its
knobs (--dppo_*), what it refuses, and its registration."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.config.algorithms.registry import AlgorithmSpec, register
from grpo_jax.config.base import _choice, _positive, opt
from grpo_jax.core.surrogates import DPPO_DIVERGENCES
from grpo_jax.errors import fail


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


def _check(o) -> None:
    """What --algorithm=dppo cannot be combined with in the objective (ObjectiveConfig `o`): another policy
    term, or an IS correction on top of a ratio that is already to the sampler."""
    why = "with --algorithm=dppo the policy term is DPPO's (a trust region on probabilities vs the sampler)"
    if o.loss.objective != "clip":
        fail(o, "loss.objective", f"{why}: leave --objective at clip (unused)")
    if o.loss.importance_level != "token":
        fail(o, "loss.importance_level", f"{why}, per token: use token")
    if o.loss.tis_enabled:
        fail(
            o,
            "loss.tis_cap" if o.loss.tis_cap is not None else "loss.tis_min",
            "DPPO's ratio is already π_θ / π_sampler: IS correction on top would weight twice: drop it",
        )


register(
    AlgorithmSpec(
        name="dppo",
        order=2,
        help="dppo (GRPO's advantages with DPPO's trust region on token probabilities against the sampler "
        "instead of the clipped ratio, prime-rl's default loss; --dppo_* flags)",
        section=DPPOConfig,
        what="DPPO's trust region",
        check=_check,
        without_ratio_policy_term="DPPO's trust region (--dppo_mask_low / --dppo_mask_high) replaces it",
        # its ratio and trust region are to the sampler already: off-policy samples need nothing more
        ratio_to_sampler=True,
    )
)
