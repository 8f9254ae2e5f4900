"""GRPO / PPO losses as pure functions (GRPO_MATH.md §1, §2, §4 T2–T8).

Shapes: B prompts, G completions per prompt, T completion tokens. Per-token arrays are [..., T] — normally
[B, G, T]; every leading axis is a "sequence" axis ([B, G, T] holds B·G sequences). `mask` [..., T] marks
valid completion tokens (float or bool). Everything is computed in float32: inputs are cast on entry.

Sign convention: `clipped_surrogate` returns the OBJECTIVE (to maximise, J); `grpo_loss` / `ppo_loss` return
the LOSS (= −J, to minimise). `logp_old`, `logp_ref`, `logp_behaviour` and the advantages are stop-gradient'ed
inside, so `jax.grad(loss)(logp)` is the gradient the trainer applies (T5 gradient table).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from grpo_jax.core.advantages import whiten
from grpo_jax.core.metrics import masked_mean
from grpo_jax.errors import fail

sg = jax.lax.stop_gradient

KL_KINDS = ("k1", "k2", "k3")
KL_ANCHORS = ("ref", "old")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "constant", "seq_mean", "seq_sum_mean")
OBJECTIVES = ("clip", "cispo", "sapo", "vespo")
TIS_LEVELS = ("token", "sequence")
TIS_MODES = ("truncate", "mask")
ENTROPY_BONUS = ("aggregate", "token_mean")
IMPORTANCE_LEVELS = ("token", "sequence", "sequence_token")

# exp() arguments are clamped to this range: exp(20) ≈ 4.9e8 is finite in float32 (max ≈ 3.4e38, and still
# finite after multiplying by an advantage or summing over a batch), while anything beyond it means the policy
# moved so far from its anchor that the exact value is meaningless anyway.
LOG_CLAMP = 20.0


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


# ------------------------------------------------------------------------------------------------------------
# KL estimators
# ------------------------------------------------------------------------------------------------------------


def kl_penalty(logp: jax.Array, logp_anchor: jax.Array, *, kind: str = "k3") -> jax.Array:
    """Per-token KL estimate of KL[π_θ || π_anchor] from sampled-token log-probs (Schulman, "Approximating
    KL divergence", 2020; DeepSeekMath eq. 4 uses k3; GRPO_MATH.md §1.1, T3):

        Δ = logp_anchor − logp
        k1 = −Δ          k2 = Δ²/2          k3 = exp(Δ) − Δ − 1   (≥ 0; ∂k3/∂logp = 1 − exp(Δ))

    Shapes: any, broadcast together. The anchor is stop-gradient'ed (it is π_ref or π_old, never trained).
    Safety: for k3 the argument of exp is clamped to [−20, 20] (only inside exp), so the value is finite
    for any input; the gradient is exact inside that range and stays finite outside it.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kl_penalty: unknown kind {kind!r}; valid kinds are {KL_KINDS}.")
    delta = sg(_f32(logp_anchor)) - _f32(logp)
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * jnp.square(delta)
    return jnp.exp(jnp.clip(delta, -LOG_CLAMP, LOG_CLAMP)) - delta - 1.0


# ------------------------------------------------------------------------------------------------------------
# clipped surrogate
# ------------------------------------------------------------------------------------------------------------


class SurrogateAux(NamedTuple):
    """Per-token (or per-sequence) diagnostics of `clipped_surrogate`: float32, the objective's shape."""

    ratio: jax.Array  # ρ = exp(logp − logp_old) before the `delta` clamp
    is_low_clipped: jax.Array  # 1.0 where A < 0 and ρ < 1 − eps_low  (ρ after the delta clamp, as TRL)
    is_high_clipped: jax.Array  # 1.0 where A > 0 and ρ > 1 + eps_high


def _surrogate_from_log_ratio(log_ratio, adv, *, eps_low, eps_high, dual_clip, delta):
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_CLAMP, LOG_CLAMP))
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)  # formed from the UNclamped ratio (TRL order)
    r1 = ratio if delta is None else jnp.minimum(ratio, delta)  # two-sided clip: ρ ← min(ρ, δ)
    objective = jnp.minimum(r1 * adv, clipped * adv)
    if dual_clip is not None:
        objective = jnp.where(adv < 0, jnp.maximum(objective, dual_clip * adv), objective)
    is_low = ((r1 < 1.0 - eps_low) & (adv < 0)).astype(jnp.float32)
    is_high = ((r1 > 1.0 + eps_high) & (adv > 0)).astype(jnp.float32)
    return objective, SurrogateAux(ratio=ratio, is_low_clipped=is_low, is_high_clipped=is_high)


def clipped_surrogate(
    logp: jax.Array,
    logp_old: jax.Array,
    adv: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    delta: float | None = None,
) -> tuple[jax.Array, SurrogateAux]:
    """PPO clipped surrogate objective per token (Schulman et al. 2017; DeepSeekMath eq. 3; DAPO clip-higher;
    TRL grpo_trainer.py::_compute_loss; GRPO_MATH.md T2):

        ρ = exp(logp − sg(logp_old))
        J = min( ρ·A , clip(ρ, 1 − eps_low, 1 + eps_high)·A )

    Options:
      dual_clip c (> 1; Ye et al. 2020, "Mastering Complex Control in MOBA Games"): for A < 0,
          J ← max(J, c·A), bounding the loss of very large ratios on negative advantages.
      delta δ (INTELLECT-2 / TRL `delta`, two-sided clip): the UNclipped branch uses ρ ← min(ρ, δ); the
          clipped branch is formed from the unclamped ρ and the clip metrics see the clamped ρ (TRL order,
          §1.9).

    logp, logp_old, adv broadcast together (adv usually [..., 1] or [..., T]); logp_old and adv are
    stop-gradient'ed. The log-ratio is clamped to [−20, 20] before exp (finite for any input).
    Returns (objective, SurrogateAux) with the broadcast shape. The objective is to be MAXIMISED.
    """
    log_ratio = _f32(logp) - sg(_f32(logp_old))
    return _surrogate_from_log_ratio(
        log_ratio, sg(_f32(adv)), eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip, delta=delta
    )


# ------------------------------------------------------------------------------------------------------------
# GSPO
# ------------------------------------------------------------------------------------------------------------


def _gspo_log_ratio(logp, logp_old, mask):
    m = jnp.asarray(mask, jnp.float32)
    return masked_mean(_f32(logp) - sg(_f32(logp_old)), m, axis=-1)  # [...]


def gspo_sequence_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO sequence importance ratio (Zheng et al. 2025, arXiv 2507.18071; GRPO_MATH.md §1.5, T6):

        s_i = (π_θ(o_i|q) / π_old(o_i|q))^{1/|o_i|} = exp( (1/|o_i|) Σ_t (logp − sg(logp_old))_{i,t} )

    logp, logp_old, mask: [..., T] -> s: [...]. A sequence with no valid tokens gets s = 1.
    Differentiable in logp: ∂s_i/∂logp_{i,t} = s_i/|o_i|.
    """
    chex.assert_equal_shape([logp, logp_old, mask])
    return jnp.exp(jnp.clip(_gspo_log_ratio(logp, logp_old, mask), -LOG_CLAMP, LOG_CLAMP))


def gspo_token_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO-token per-token ratio (Zheng et al. 2025, §4.3; GRPO_MATH.md §1.5):

        s_{i,t} = sg[s_i] · π_θ(o_{i,t}) / sg[π_θ(o_{i,t})] = sg[s_i] · exp(logp − sg(logp))

    Its VALUE equals s_i at every token; its gradient wrt logp_{i,t} is s_i (per token), so with a per-token
    mean inside each sequence and Â_{i,t} = Â_i the gradient equals GSPO's. [..., T] -> [..., T].
    """
    chex.assert_equal_shape([logp, logp_old, mask])
    lp = _f32(logp)
    log_s = sg(_gspo_log_ratio(logp, logp_old, mask))[..., None]
    return jnp.exp(jnp.clip(log_s + lp - sg(lp), -LOG_CLAMP, LOG_CLAMP))


# ------------------------------------------------------------------------------------------------------------
# aggregation
# ------------------------------------------------------------------------------------------------------------


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    *,
    mode: str,
    max_len: int | None = None,
    token_count: jax.Array | float | None = None,
    num_seqs: int | None = None,
) -> jax.Array:
    """Reduce a per-token loss to a scalar (GRPO_MATH.md §1.1 "How the loss is averaged", T4).

    per_token, mask: [..., T]; every leading axis is a sequence axis (N = their product, e.g. B·G).
      "seq_mean_token_mean" (DeepSeekMath eq. 3; TRL "grpo"):  (1/N) Σ_i (1/|o_i|) Σ_t ℓ_{i,t}
      "token_mean" (DAPO eq. 12; TRL "dapo"/"bnpo"):           Σ_{i,t} ℓ_{i,t} / Σ_i |o_i|
      "constant" (Dr. GRPO; TRL "dr_grpo"):                    Σ_{i,t} ℓ_{i,t} / (N · max_len)
          max_len is the CONFIGURED max completion length (a Python int), never the observed/padded length.
      "seq_sum_mean" (LUSPO; TRL "luspo"):                     (1/N) Σ_i Σ_t ℓ_{i,t}
      "seq_mean" (GSPO; one term per sequence):                (1/N) Σ_i ℓ_i
          per_token may be [...] (one value per sequence, used as is) or [..., T] holding the sequence value
          broadcast over its tokens (then ℓ_i = its masked mean over T, i.e. the value itself). For [..., T]
          input this is numerically the same as "seq_mean_token_mean".
    N counts every sequence, including fully masked ones (they contribute 0), as TRL's `.mean()` does.
    Zero valid tokens never give NaN (denominators are max(·, 1)).
    token_count: optional override of Σ|o_i| for "token_mean" (e.g. the active-token count of the whole
    accumulated global batch, TRL "dapo", when this call sees only a micro-batch).
    num_seqs: optional override of N for every other mode (the whole batch's sequence count when this call
    sees one micro-batch of it): the micro-batches' losses then SUM to the whole batch's.
    """
    m = jnp.asarray(mask, jnp.float32)
    x = _f32(per_token)
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregate: unknown mode {mode!r}; valid modes are {AGGREGATIONS}.")
    n_seq = max(int(m[..., 0].size), 1) if num_seqs is None else int(num_seqs)  # static
    if n_seq < 1:
        raise ValueError(f"aggregate: num_seqs={num_seqs} must be >= 1")
    if mode == "seq_mean" and x.ndim == m.ndim - 1:
        chex.assert_shape(x, m.shape[:-1])
        return x.sum() / n_seq
    chex.assert_equal_shape([x, m])
    if mode in ("seq_mean_token_mean", "seq_mean"):
        per_seq = (x * m).sum(-1) / jnp.maximum(m.sum(-1), 1.0)  # [...]
        return per_seq.sum() / n_seq
    if mode == "token_mean":
        denom = m.sum() if token_count is None else _f32(token_count)
        return (x * m).sum() / jnp.maximum(denom, 1.0)
    if mode == "seq_sum_mean":  # LUSPO: each sequence's sum, averaged over sequences
        return (x * m).sum() / n_seq
    # constant
    if max_len is None or int(max_len) <= 0:
        raise ValueError(f"aggregate(mode='constant') needs max_len, a positive Python int; got {max_len!r}.")
    return (x * m).sum() / (n_seq * int(max_len))


# ------------------------------------------------------------------------------------------------------------
# entropy, overlong shaping
# ------------------------------------------------------------------------------------------------------------


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Per-position entropy H = −Σ_v p_v log p_v of softmax(logits), in float32 via log_softmax.

    logits: [..., V] -> [..., ]. Entries of −inf (masked vocabulary) contribute 0, not NaN.
    """
    logp = jax.nn.log_softmax(_f32(logits), axis=-1)
    p = jnp.exp(logp)
    return -jnp.where(p > 0, p * logp, 0.0).sum(-1)


def soft_overlong_punishment(lengths: jax.Array, *, max_len: int, cache_len: int) -> jax.Array:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13;
    TRL get_soft_overlong_punishment; GRPO_MATH.md T7), counted in TOKENS:

        R_length(y) = 0                                     |y| ≤ L_max − L_cache
                    = ((L_max − L_cache) − |y|) / L_cache   L_max − L_cache < |y| ≤ L_max
                    = −1                                    |y| > L_max

    lengths: any shape of token counts -> float32 of the same shape. Added to the correctness reward.
    """
    if cache_len <= 0 or max_len <= cache_len:
        raise ValueError(
            f"soft_overlong_punishment needs 0 < cache_len < max_len; got {max_len=}, {cache_len=}."
        )
    y = _f32(lengths)
    free = float(max_len - cache_len)
    ramp = (free - y) / float(cache_len)
    return jnp.where(y <= free, 0.0, jnp.where(y <= float(max_len), ramp, -1.0))


# ------------------------------------------------------------------------------------------------------------
# GRPO loss
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GRPOLossConfig:
    """Static configuration of `grpo_loss` (frozen and hashable: usable as a static jit argument).

    Each field's meaning is in its `help` metadata (also the text of the command-line flag that sets it,
    grpo_jax.cli). `max_len` is the configured max completion length L of the "constant" aggregation; the run
    config derives it from the rollout's max_new_tokens (grpo_jax.config.RunConfig), and `aggregate` raises
    if "constant" is used without it. A bad value raises grpo_jax.errors.ConfigError naming the field.
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
        if self.objective != "clip" and self.dual_clip is not None:
            fail(self, "dual_clip", f"applies to objective=clip only (objective={self.objective})")
        if self.objective == "vespo" and self.tis_enabled and self.tis_level != "token":
            fail(self, "tis_level", "objective=vespo folds a token-level IS ratio into its weight: use token")

    @property
    def tis_enabled(self) -> bool:
        """The IS correction is on when either bound is set."""
        return self.tis_cap is not None or self.tis_min is not None

    @property
    def uses_behaviour(self) -> bool:
        """Does the loss need the sampler's log-probs (IS correction or the off-policy mask)?"""
        return self.tis_enabled or self.off_policy_mask_threshold is not None


class PerTokenTerms(NamedTuple):
    """Per-token intermediates of `grpo_per_token_loss`, each [..., T] float32."""

    surrogate: jax.Array  # the objective's term to maximise before masks and IS weight (clip: J)
    weight: jax.Array  # IS-correction weight × off-policy mask × entropy mask (1 without them)
    kl: jax.Array  # KL estimate (× the importance ratio with kl_bias_correction; 0 when the KL is skipped)
    entropy: jax.Array  # per-token entropy (0 when not given)
    ratio: jax.Array  # the importance ratio used (token ρ, GSPO s_i broadcast, or GSPO-token s_{i,t})
    is_low_clipped: jax.Array
    is_high_clipped: jax.Array
    adv: jax.Array  # advantage broadcast to tokens
    entropy_mask: jax.Array  # 1 where the policy term is kept by top_entropy_quantile (the valid mask if off)
    phi: jax.Array  # VESPO's sequence weight φ broadcast to tokens (1 for other objectives)
    is_weight: jax.Array  # the IS-correction weight alone (1 when off or for vespo, where φ holds it)
    off_policy: jax.Array  # the off-policy mask alone (1 when off)


class LossAux(NamedTuple):
    """Scalar diagnostics of `grpo_loss` (masked token means unless stated)."""

    loss: jax.Array
    pg_loss: jax.Array  # the policy term alone, aggregated like the loss
    kl: jax.Array  # masked token mean of the KL estimate (0 when the KL is skipped)
    entropy: jax.Array  # masked token mean of the given entropy (0 when none given)
    clip_low_frac: jax.Array  # token mean; with importance_level=sequence a plain mean over sequences (TRL)
    clip_high_frac: jax.Array  # likewise (cispo: the share of ratios above the cap with A > 0)
    clip_region_frac: jax.Array  # low + high
    ratio_mean: jax.Array
    ratio_max: jax.Array  # over valid tokens (0 if there are none)
    ratio_min: jax.Array
    adv_mean: jax.Array  # over valid tokens (advantage broadcast to tokens)
    adv_abs_mean: jax.Array
    clip_low_min: (
        jax.Array
    )  # min over sequences of each sequence's low-clipped share (TRL clip_ratio/low_min)
    clip_high_max: jax.Array  # max over sequences of each sequence's high-clipped share (TRL high_max)
    is_weight_mean: jax.Array  # mean IS-correction weight over valid tokens (1 when off)
    off_policy_kept: jax.Array  # share of sequences the off-policy mask keeps (1 when off)
    entropy_kept: jax.Array  # share of valid tokens the entropy mask keeps (1 when off)
    phi_mean: jax.Array  # VESPO: token mean of φ (TRL vespo/phi_seq_mean; 1 for other objectives)


def masked_quantile(x: jax.Array, mask: jax.Array, q: float) -> jax.Array:
    """The q-quantile of x over mask > 0, linear interpolation between order statistics (torch.quantile's
    default): position q·(n − 1) of the sorted valid values. Any shapes (flattened); NaN when n = 0."""
    xm = jnp.where(jnp.asarray(mask) > 0, _f32(x), jnp.inf).ravel()
    n = jnp.sum(jnp.asarray(mask) > 0)
    xs = jnp.sort(xm)
    pos = jnp.float32(q) * jnp.maximum(n - 1, 0).astype(jnp.float32)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    frac = pos - lo.astype(jnp.float32)
    a, b = xs[lo], xs[hi]
    val = a + frac * jnp.where(frac > 0, b - a, 0.0)
    return jnp.where(n > 0, val, jnp.nan)


def vespo_weights(
    adv: jax.Array,
    log_ratio: jax.Array,
    mask: jax.Array,
    is_ratio: jax.Array | None = None,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> jax.Array:
    """VESPO's sequence weight (TRL grpo_trainer.py::get_gamma_weights), stop-gradient:

        log w = clip( Σ_t clip(log ρ_t, −20, 20)·m_t  [+ Σ_t clip(log IS_t, log 1e-8, 20)],  log 1e-8, 20 )
        φ(w)  = exp( λ + k·log w − λ·w )        (k, λ = k_pos, λ_pos where A ≥ 0, else k_neg, λ_neg; λ ≥ 1e-4)

    φ(1) = 1; non-finite φ becomes 0. adv [..., 1] (or [..., T]), log_ratio / mask / is_ratio [..., T]
    (is_ratio: the token-level IS-correction ratio, summed in log space over every position as TRL does).
    Returns φ with adv's shape (per sequence for a per-sequence advantage)."""
    lower = math.log(1e-8)
    m = _f32(mask)
    lr = jnp.clip(sg(_f32(log_ratio)), -20.0, 20.0)
    seq = jnp.sum(lr * m, axis=-1, keepdims=True)
    if is_ratio is not None:
        seq = seq + jnp.sum(jnp.clip(jnp.log(sg(_f32(is_ratio))), lower, 20.0), axis=-1, keepdims=True)
    log_w = jnp.clip(seq, lower, 20.0)
    w = jnp.exp(log_w)
    a = sg(_f32(adv))
    pos = a >= 0
    k = jnp.where(pos, k_pos, k_neg)
    lam = jnp.maximum(jnp.where(pos, lambda_pos, lambda_neg), 1e-4)
    phi = jnp.exp(lam + k * log_w - lam * w)
    return sg(jnp.where(jnp.isfinite(phi), phi, 0.0))


def _is_weight(lp_old, lp_b, m, cfg: GRPOLossConfig):
    """TRL's vLLM importance-sampling correction: exp((π_old − π_behaviour) log-prob differences), per token
    or summed per sequence, truncated to [C_min, C_max] or masked to 0 outside it. Stop-gradient."""
    d = jnp.where(m > 0, lp_old - lp_b, 0.0)
    d = jnp.where(jnp.isnan(d), 0.0, d)  # tokens the sampler could not score: no correction
    if cfg.tis_level == "sequence":
        d = jnp.sum(d, axis=-1, keepdims=True)
    w = jnp.exp(jnp.clip(d, -LOG_CLAMP, LOG_CLAMP))
    lo = -jnp.inf if cfg.tis_min is None else cfg.tis_min
    hi = jnp.inf if cfg.tis_cap is None else cfg.tis_cap
    if cfg.tis_mode == "truncate":
        w = jnp.clip(w, lo, hi)
    else:
        w = jnp.where((w < lo) | (w > hi), 0.0, w)
    return sg(w)


def grpo_per_token_loss(
    logp: jax.Array,
    logp_old: jax.Array,
    logp_ref: jax.Array | None,
    adv: jax.Array,
    mask: jax.Array,
    *,
    cfg: GRPOLossConfig,
    kl_coef: jax.Array | float,
    entropy_coef: jax.Array | float,
    entropy: jax.Array | None = None,
    logp_behaviour: jax.Array | None = None,
    entropy_threshold: jax.Array | None = None,
) -> tuple[jax.Array, PerTokenTerms]:
    """Per-token GRPO loss ℓ_{i,t} before aggregation (arguments as `grpo_loss`), in TRL 1.16's order
    (grpo_trainer.py::_compute_loss):

        ℓ = P·M_off·M_H·W + kl_coef·KL  [− entropy_coef·H with entropy_bonus="aggregate"]

    P the objective's policy term at cfg.importance_level (clip: −min(ρA, clip(ρ)A); cispo, sapo, vespo: see
    GRPOLossConfig.objective), M_off the off-policy sequence mask, M_H the top-entropy mask, W the IS
    correction (folded into φ for vespo instead), KL the cfg.kl_estimator estimate (× the importance ratio
    with kl_bias_correction: the sequence ratio s_i at importance_level="sequence", as TRL). The KL is not
    masked or weighted.
    Returns (per_token_loss [..., T], PerTokenTerms). Padding is made harmless: every per-token input is
    replaced by 0 where mask == 0 before use, so garbage there (−inf, NaN) reaches neither the loss nor the
    gradient; the aggregation then masks those positions out.
    """
    m = jnp.asarray(mask, jnp.float32)  # [..., T]
    valid = m > 0

    def clean(x):  # [..., T] -> float32 with padding zeroed (value AND gradient stay finite)
        x = _f32(x)
        chex.assert_equal_shape([x, m])
        return jnp.where(valid, x, 0.0)

    lp = clean(logp)  # [..., T]
    lp_old = sg(clean(logp_old))  # [..., T]
    a = sg(_f32(adv))
    if a.ndim == lp.ndim - 1:
        chex.assert_shape(a, lp.shape[:-1])
        a = a[..., None]  # [..., 1] one advantage per sequence
    elif a.shape != lp.shape:
        chex.assert_shape(a, (*lp.shape[:-1], 1))  # [..., 1] one advantage per sequence
    else:
        a = jnp.where(valid, a, 0.0)  # [..., T] per-token advantages (e.g. process supervision)
    a_tok = jnp.broadcast_to(a, lp.shape)
    ones = jnp.ones_like(lp)

    # the importance ratio at cfg.importance_level (differentiable; its log clamped to ±LOG_CLAMP)
    if cfg.importance_level == "token":
        log_w = lp - lp_old
        a_w = a
    elif cfg.importance_level == "sequence":
        log_w = _gspo_log_ratio(lp, lp_old, m)[..., None]  # [..., 1]
        # GSPO: one ratio and one clip decision per sequence; the sequence advantage is the mean of a over
        # valid tokens (equals Â_i when adv is per sequence).
        a_w = masked_mean(a_tok, m, axis=-1)[..., None] if a.shape == lp.shape else a
    else:  # sequence_token
        log_w = sg(_gspo_log_ratio(lp, lp_old, m))[..., None] + lp - sg(lp)
        a_w = a
    ratio = jnp.exp(jnp.clip(log_w, -LOG_CLAMP, LOG_CLAMP))

    behaviour = None if logp_behaviour is None else sg(clean(logp_behaviour))
    is_w = None
    if cfg.tis_enabled:
        if behaviour is None:
            raise ValueError(
                "grpo_loss: the IS correction (tis_cap / tis_min) is on, so logp_behaviour (the sampler's "
                "log-probs) is needed."
            )
        is_w = _is_weight(lp_old, behaviour, m, cfg)

    phi = ones
    zero = jnp.zeros_like(lp)
    low, high = zero, zero
    if cfg.objective == "clip":
        clip_kw = dict(eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip, delta=cfg.delta)
        surrogate, saux = _surrogate_from_log_ratio(log_w, a_w, **clip_kw)
        low, high = saux.is_low_clipped, saux.is_high_clipped
    elif cfg.objective == "cispo":
        surrogate = sg(jnp.minimum(ratio, cfg.eps_high)) * a_w * lp
        high = ((ratio > cfg.eps_high) & (a_w > 0)).astype(jnp.float32)
    elif cfg.objective == "sapo":
        tau = jnp.where(a_w > 0, cfg.sapo_temp_pos, cfg.sapo_temp_neg)
        surrogate = jax.nn.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * a_w
    else:  # vespo: φ from the token log ratios (and the token IS ratio), whatever importance_level says
        phi = vespo_weights(
            a,
            lp - lp_old,
            m,
            is_w,
            k_pos=cfg.vespo_k_pos,
            lambda_pos=cfg.vespo_lambda_pos,
            k_neg=cfg.vespo_k_neg,
            lambda_neg=cfg.vespo_lambda_neg,
        )
        surrogate = phi * a * lp
    surrogate = jnp.broadcast_to(surrogate, lp.shape)

    off = ones
    if cfg.off_policy_mask_threshold is not None:
        samp = lp_old if behaviour is None else behaviour
        d = jnp.where(valid, samp - sg(lp), 0.0)
        d = jnp.where(jnp.isnan(d), 0.0, d)
        avg = jnp.sum(d * m, -1, keepdims=True) / jnp.maximum(jnp.sum(m, -1, keepdims=True), 1.0)
        off = jnp.broadcast_to(
            ((a >= 0) | (avg <= cfg.off_policy_mask_threshold)).astype(jnp.float32), lp.shape
        )
    ent = zero if entropy is None else clean(entropy)
    ent_mask = m
    if cfg.top_entropy_quantile < 1.0:
        if entropy is None:
            raise ValueError("grpo_loss: top_entropy_quantile < 1 needs the per-token entropy")
        thr = masked_quantile(sg(ent), m, 1.0 - cfg.top_entropy_quantile)
        if entropy_threshold is not None:  # the whole batch's quantile, for a micro-batch of it
            thr = sg(_f32(entropy_threshold))
        ent_mask = ((sg(ent) * m >= thr) & valid).astype(jnp.float32)
    isw = ones if is_w is None or cfg.objective == "vespo" else jnp.broadcast_to(is_w, lp.shape)
    weight = off * (ent_mask if cfg.top_entropy_quantile < 1.0 else ones) * isw

    anchor = logp_ref if cfg.kl_anchor == "ref" else lp_old
    if anchor is None:
        kl = zero
    else:
        anchor = clean(anchor)
        kl = kl_penalty(lp, anchor, kind=cfg.kl_estimator)
        if cfg.kl_bias_correction:
            kl = kl * ratio  # the importance ratio of cfg.importance_level (s_i broadcast for "sequence")

    bonus = _f32(entropy_coef) * ent if cfg.entropy_bonus == "aggregate" else zero
    per_token = -(weight * surrogate) + _f32(kl_coef) * kl - bonus
    terms = PerTokenTerms(
        surrogate=surrogate,
        weight=weight,
        kl=kl,
        entropy=ent,
        ratio=jnp.broadcast_to(ratio, lp.shape),
        is_low_clipped=jnp.broadcast_to(low, lp.shape),
        is_high_clipped=jnp.broadcast_to(high, lp.shape),
        adv=a_tok,
        entropy_mask=ent_mask,
        phi=jnp.broadcast_to(phi, lp.shape),
        is_weight=isw,
        off_policy=off,
    )
    return per_token, terms


def grpo_loss(
    logp: jax.Array,
    logp_old: jax.Array,
    logp_ref: jax.Array | None,
    adv: jax.Array,
    mask: jax.Array,
    *,
    cfg: GRPOLossConfig,
    kl_coef: jax.Array | float,
    entropy_coef: jax.Array | float,
    entropy: jax.Array | None = None,
    logp_behaviour: jax.Array | None = None,
    num_items: jax.Array | float | None = None,
    num_seqs: int | None = None,
    entropy_threshold: jax.Array | None = None,
    entropy_items: jax.Array | None = None,
) -> tuple[jax.Array, LossAux]:
    """GRPO loss (DeepSeekMath eq. 3–4, arXiv 2402.03300; variants DAPO / Dr. GRPO / GSPO / LUSPO / CISPO /
    SAPO / VESPO; TRL 1.16 grpo_trainer.py::_compute_loss; GRPO_MATH.md §1, T5):

        ℓ_{i,t} = see grpo_per_token_loss (clip: −w·min(ρA, clip(ρ, 1−ε_l, 1+ε_h)A) + kl_coef·KL − ...)
        loss    = aggregate(ℓ, mask, mode=cfg.aggregation, max_len=cfg.max_len, token_count=num_items)
                  [− entropy_coef · Σ H·m_H / max(Σ m_H, 1)  with entropy_bonus="token_mean"]

    logp [..., T] (current policy, differentiated), logp_old [..., T] (sampling policy π_old), logp_ref
    [..., T] or None (frozen π_ref; None skips the KL when cfg.kl_anchor == "ref"), adv [...] (per sequence,
    broadcast over T) or [..., T] (per token), mask [..., T]; entropy [..., T] or None (needed for
    top_entropy_quantile < 1); logp_behaviour [..., T] (the sampler's; needed iff the IS correction is on;
    used by the off-policy mask when given, else logp_old); num_items: the token count that "token_mean"
    divides by (TRL's num_items_in_batch for dapo / cispo / vespo; default the mask's). For a micro-batch of
    a bigger batch (gradient accumulation, grpo_jax.train.step) the whole batch's normalisers are passed, so
    the micro-batches' losses and gradients sum to the whole batch's: num_items (its token count), num_seqs
    (its sequence count N), entropy_threshold (its top-entropy quantile) and entropy_items (its count of
    tokens in the entropy bonus, Σ m·M_H, for entropy_bonus="token_mean"). kl_coef /
    entropy_coef are traced scalars (controllers change them without recompiling). Returns (loss, LossAux).
    """
    per_token, t = grpo_per_token_loss(
        logp,
        logp_old,
        logp_ref,
        adv,
        mask,
        cfg=cfg,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        entropy=entropy,
        logp_behaviour=logp_behaviour,
        entropy_threshold=entropy_threshold,
    )
    m = jnp.asarray(mask, jnp.float32)
    agg = dict(mode=cfg.aggregation, max_len=cfg.max_len, token_count=num_items, num_seqs=num_seqs)
    loss = aggregate(per_token, m, **agg)
    if cfg.entropy_bonus == "token_mean":
        eff = m * t.entropy_mask
        n_eff = jnp.sum(eff) if entropy_items is None else _f32(entropy_items)
        loss = loss - _f32(entropy_coef) * jnp.sum(t.entropy * eff) / jnp.maximum(n_eff, 1.0)
    pg_loss = aggregate(-(t.weight * t.surrogate), m, **agg)
    has = m.sum() > 0
    valid = m > 0
    seq_has = m.sum(-1) > 0  # [...]
    if cfg.importance_level == "sequence":  # one value per sequence: plain means over sequences (TRL)
        low_seq, high_seq = t.is_low_clipped[..., 0], t.is_high_clipped[..., 0]
        low, high = jnp.mean(low_seq), jnp.mean(high_seq)
    else:
        low, high = masked_mean(t.is_low_clipped, m), masked_mean(t.is_high_clipped, m)
        low_seq = masked_mean(t.is_low_clipped, m, axis=-1)
        high_seq = masked_mean(t.is_high_clipped, m, axis=-1)
    any_seq = jnp.any(seq_has)
    n_seq = max(int(m[..., 0].size), 1)
    aux = LossAux(
        loss=loss,
        pg_loss=pg_loss,
        kl=masked_mean(t.kl, m),
        entropy=masked_mean(t.entropy, m),
        clip_low_frac=low,
        clip_high_frac=high,
        clip_region_frac=low + high,
        ratio_mean=masked_mean(t.ratio, m),
        ratio_max=jnp.where(has, jnp.where(valid, t.ratio, -jnp.inf).max(), 0.0),
        ratio_min=jnp.where(has, jnp.where(valid, t.ratio, jnp.inf).min(), 0.0),
        adv_mean=masked_mean(t.adv, m),
        adv_abs_mean=masked_mean(jnp.abs(t.adv), m),
        clip_low_min=jnp.where(any_seq, jnp.where(seq_has, low_seq, jnp.inf).min(), 0.0),
        clip_high_max=jnp.where(any_seq, jnp.where(seq_has, high_seq, -jnp.inf).max(), 0.0),
        is_weight_mean=masked_mean(t.is_weight, m),
        off_policy_kept=jnp.sum(t.off_policy[..., 0]) / n_seq,
        entropy_kept=masked_mean(t.entropy_mask, m),
        phi_mean=masked_mean(t.phi, m),
    )
    return loss, jax.tree_util.tree_map(sg, aux)


# ------------------------------------------------------------------------------------------------------------
# PPO pieces (GRPO_MATH.md §2, T8)
# ------------------------------------------------------------------------------------------------------------


def gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    lam: float,
    last_value: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438; TRL ppo_trainer.py), computed
    backwards with lax.scan over the last axis:

        δ_t = r_t + γ V_{t+1} − V_t            Â_t = δ_t + γλ Â_{t+1}            R̂_t = Â_t + V_t

    rewards, values, mask: [..., T]. The mask is a prefix mask (valid tokens, then padding). After the last
    valid token V_{t+1} = last_value ([...] or scalar; default 0 = terminal) and Â_{t+1} = 0.
    Returns (advantages, returns), both [..., T] float32, 0 at masked positions. Not whitened (see `whiten`).
    """
    r = _f32(rewards)
    v = _f32(values)
    m = jnp.asarray(mask, jnp.float32)
    chex.assert_equal_shape([r, v, m])
    lead = r.shape[:-1]
    lv = jnp.zeros(lead, jnp.float32) if last_value is None else jnp.broadcast_to(_f32(last_value), lead)

    def step(carry, x):
        adv_next, v_next = carry
        r_t, v_t, m_t = x
        delta = r_t + gamma * v_next - v_t
        adv = (delta + gamma * lam * adv_next) * m_t
        return (adv, jnp.where(m_t > 0, v_t, lv)), adv

    xs = (jnp.moveaxis(r, -1, 0), jnp.moveaxis(v, -1, 0), jnp.moveaxis(m, -1, 0))  # [T, ...]
    _, adv = jax.lax.scan(step, (jnp.zeros(lead, jnp.float32), lv), xs, reverse=True)
    adv = jnp.moveaxis(adv, 0, -1)
    return adv, (adv + v) * m


def kl_shaped_rewards(
    scores: jax.Array,
    logp: jax.Array,
    logp_ref: jax.Array,
    mask: jax.Array,
    *,
    kl_coef: jax.Array | float,
    kind: str = "k1",
) -> jax.Array:
    """PPO-for-LMs per-token reward with the KL folded in (DeepSeekMath eq. 2; TRL ppo_trainer.py):

        r_t = −kl_coef · k(logp_t, logp_ref_t)     for every valid token,   r_{last valid} += score

    scores: [...] sequence scores; logp (the rollout policy's, π_old), logp_ref, mask: [..., T].
    k is `kl_penalty(logp, logp_ref, kind)` (k1 = logp − logp_ref, TRL's default). The result is a reward
    (data), so it is stop-gradient'ed. A sequence with no valid token gets no score. Returns [..., T] float32.
    """
    m = jnp.asarray(mask, jnp.float32)
    lp = _f32(logp)
    chex.assert_equal_shape([lp, _f32(logp_ref), m])
    s = _f32(scores)
    chex.assert_shape(s, lp.shape[:-1])
    T = lp.shape[-1]
    per_tok = -_f32(kl_coef) * kl_penalty(lp, logp_ref, kind=kind) * m
    last = T - 1 - jnp.argmax(m[..., ::-1] > 0, axis=-1)  # [...] index of the last valid token
    has = m.sum(-1) > 0
    at_last = jax.nn.one_hot(last, T, dtype=jnp.float32) * jnp.where(has, s, 0.0)[..., None]
    return sg(per_tok + at_last)


def clipped_value_loss(
    values: jax.Array,
    values_old: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    eps_v: float,
    num_items: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """PPO clipped value loss (TRL ppo_trainer.py; GRPO_MATH.md §2, T8):

        L_V = 0.5 · mean_t max( (V − R̂)², (clip(V, V_old − ε_v, V_old + ε_v) − R̂)² )

    values [..., T] (differentiated), values_old, returns [..., T] (stop-gradient'ed), mask [..., T].
    num_items: the token count the mean divides by (default the mask's; a micro-batch of a bigger batch
    passes the whole batch's, so the micro-batch losses sum to the batch's, as `grpo_loss`'s num_items).
    Returns (loss scalar, clip_frac = masked fraction of tokens where the clipped error is the larger).
    T8: V_old 0.5, V 0.9, R̂ 1.0, ε_v 0.2 -> 0.5·max(0.01, 0.09) = 0.045.
    """
    v = _f32(values)
    v_old = sg(_f32(values_old))
    ret = sg(_f32(returns))
    m = jnp.asarray(mask, jnp.float32)
    chex.assert_equal_shape([v, v_old, ret, m])
    v_clip = jnp.clip(v, v_old - eps_v, v_old + eps_v)
    unclipped = jnp.square(v - ret)
    clipped = jnp.square(v_clip - ret)
    worst = jnp.where(m > 0, jnp.maximum(unclipped, clipped), 0.0)  # padding garbage never reaches the loss
    if num_items is None:
        loss = 0.5 * masked_mean(worst, m)
    else:
        loss = 0.5 * jnp.sum(worst * m) / jnp.maximum(_f32(num_items), 1.0)
    return loss, sg(masked_mean((clipped > unclipped).astype(jnp.float32), m))


class PPOTargets(NamedTuple):
    """What `ppo_token_advantages` returns, each [..., T] float32, stop-gradient'ed, 0 at masked positions."""

    adv: jax.Array  # GAE advantages Â (whitened over the valid tokens when asked)
    returns: jax.Array  # value targets R̂ = Â + V_old (from the advantages BEFORE whitening)
    rewards: jax.Array  # per-token rewards: −β·k_t, plus the sequence score on the last valid token


def ppo_token_advantages(
    scores: jax.Array,
    values_old: jax.Array,
    mask: jax.Array,
    *,
    logp_old: jax.Array | None = None,
    logp_ref: jax.Array | None = None,
    kl_coef: jax.Array | float = 0.0,
    kl_kind: str = "k1",
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten_advantages: bool = True,
) -> PPOTargets:
    """PPO's per-token advantages and value targets for a language model (GRPO_MATH.md §2; TRL
    ppo_trainer.py, the RLHF recipe of Ziegler et al. 2019):

        r_t  = −kl_coef · k(logp_old_t, logp_ref_t)   (+ score on the last valid token)   `kl_shaped_rewards`
        Â, R̂ = GAE(r, V_old; γ, λ) with V after the last valid token = 0                 `gae`
        Â    ← whiten(Â) over every valid token of the batch (masked mean / Bessel var, eps 1e-8)  `whiten`

    scores [...] (the terminal reward of each sequence), values_old [..., T] (the critic at the rollout's
    parameters), mask [..., T] prefix masks of the valid tokens; logp_old / logp_ref [..., T] or None (no
    reference: no KL term, only the score). R̂ comes from the un-whitened Â, as in TRL.
    """
    m = jnp.asarray(mask, jnp.float32)
    v = jnp.where(m > 0, sg(_f32(values_old)), 0.0)
    if logp_ref is None:
        lp = lr = jnp.zeros_like(m)
        kl_coef = 0.0
    else:
        if logp_old is None:
            raise ValueError("ppo_token_advantages: logp_ref needs logp_old (the rollout policy's log-probs)")
        lp = jnp.where(m > 0, sg(_f32(logp_old)), 0.0)
        lr = jnp.where(m > 0, sg(_f32(logp_ref)), 0.0)
    rewards = kl_shaped_rewards(scores, lp, lr, m, kl_coef=sg(_f32(kl_coef)), kind=kl_kind)
    adv, returns = gae(rewards, v, m, gamma=gamma, lam=lam)
    if whiten_advantages:
        adv = whiten(adv, m) * m
    return PPOTargets(adv=sg(adv), returns=sg(returns), rewards=rewards)


class PPOAux(NamedTuple):
    """Scalar diagnostics of `ppo_loss`."""

    loss: jax.Array
    pg_loss: jax.Array
    vf_loss: jax.Array
    entropy: jax.Array  # masked mean (0 when none given)
    clip_frac: jax.Array  # policy: fraction of tokens with a zero policy gradient from clipping
    vf_clip_frac: jax.Array
    approx_kl: jax.Array  # 0.5 · mean (logp − logp_old)²  (TRL's approxkl)
    ratio_mean: jax.Array


def ppo_loss(
    logp: jax.Array,
    logp_old: jax.Array,
    values: jax.Array,
    values_old: jax.Array,
    adv: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    eps: float = 0.2,
    eps_v: float = 0.2,
    vf_coef: jax.Array | float = 0.1,
    entropy_coef: jax.Array | float = 0.0,
    entropy: jax.Array | None = None,
) -> tuple[jax.Array, PPOAux]:
    """Token-level PPO loss for LMs (Schulman et al. 2017; TRL ppo_trainer.py; GRPO_MATH.md §2):

        L = mean_t max(−Â ρ, −Â clip(ρ, 1−ε, 1+ε)) + vf_coef · L_V − entropy_coef · mean_t H

    All inputs [..., T]; adv are per-token GAE advantages (whiten them first if desired); masked token means.
    Defaults are TRL PPOConfig's (ε = ε_v = 0.2, vf_coef = 0.1). Returns (loss, PPOAux).
    """
    m = jnp.asarray(mask, jnp.float32)
    objective, saux = clipped_surrogate(logp, logp_old, adv, eps_low=eps, eps_high=eps)
    chex.assert_equal_shape([objective, m])
    pg_loss = masked_mean(-objective, m)
    vf_loss, vf_clip_frac = clipped_value_loss(values, values_old, returns, m, eps_v=eps_v)
    ent = jnp.zeros((), jnp.float32) if entropy is None else masked_mean(entropy, m)
    loss = pg_loss + _f32(vf_coef) * vf_loss - _f32(entropy_coef) * ent
    log_ratio = _f32(logp) - _f32(logp_old)
    aux = PPOAux(
        loss=loss,
        pg_loss=pg_loss,
        vf_loss=vf_loss,
        entropy=ent,
        clip_frac=masked_mean(saux.is_low_clipped + saux.is_high_clipped, m),
        vf_clip_frac=vf_clip_frac,
        approx_kl=0.5 * masked_mean(jnp.square(log_ratio), m),
        ratio_mean=masked_mean(saux.ratio, m),
    )
    return loss, jax.tree_util.tree_map(sg, aux)
