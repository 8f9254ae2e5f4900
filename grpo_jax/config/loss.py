"""The policy loss of every algorithm (grpo_jax.algorithms.policy_loss): PolicyLossConfig, the objective's
`loss` section."""

from __future__ import annotations

import dataclasses

from grpo_jax.config.base import Mechanism, _check_sub_settings, _is_int, _is_real
from grpo_jax.core.aggregation import AGGREGATIONS
from grpo_jax.core.kl import KL_ANCHORS, KL_KINDS
from grpo_jax.core.surrogates import IMPORTANCE_LEVELS, OBJECTIVES, TIS_LEVELS, TIS_MODES
from grpo_jax.errors import fail

ENTROPY_BONUS = ("aggregate", "token_mean")


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
        _check_sub_settings(self, "objective.loss", SUB_SETTINGS)

    @property
    def tis_enabled(self) -> bool:
        """The IS correction is on when either bound is set."""
        return self.tis_cap is not None or self.tis_min is not None

    @property
    def uses_behaviour(self) -> bool:
        """Does the loss need the sampler's log-probs (IS correction or the off-policy mask)?"""
        return self.tis_enabled or self.off_policy_mask_threshold is not None


# the sub-settings of the loss's own options (base.Mechanism: one rule); those of the TRL-style fields that
# every loss carries whatever its policy term are the objective's (grpo_jax.config.objective)
SUB_SETTINGS: tuple[Mechanism, ...] = (
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
)
