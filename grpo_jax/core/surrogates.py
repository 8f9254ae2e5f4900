"""The per-token policy terms of the policy loss and their ratios (docs/GRPO_MATH.md §1, §4 T2, T6): the
clipped surrogate, CISPO, SAPO and VESPO (one function each, dispatched by name through `SURROGATES`),
GSPO sequence ratios, and the IS-correction weight of off-policy samples. Pure jnp.

Sign convention: a policy term returns the OBJECTIVE (to maximise, J); the loss (grpo_jax.algorithms) is −J.
π_old, the sampler's log-probs and the advantages are stop-gradient'ed inside.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from grpo_jax.core.metrics import LOG_CLAMP, f32, masked_mean

sg = jax.lax.stop_gradient

IMPORTANCE_LEVELS = ("token", "sequence", "sequence_token")
TIS_LEVELS = ("token", "sequence")
TIS_MODES = ("truncate", "mask")


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
    TRL grpo_trainer.py::_compute_loss; docs/GRPO_MATH.md T2):

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
    log_ratio = f32(logp) - sg(f32(logp_old))
    return _surrogate_from_log_ratio(
        log_ratio, sg(f32(adv)), eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip, delta=delta
    )


def gspo_log_ratio(logp, logp_old, mask):
    m = jnp.asarray(mask, jnp.float32)
    return masked_mean(f32(logp) - sg(f32(logp_old)), m, axis=-1)  # [...]


def gspo_sequence_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO sequence importance ratio (Zheng et al. 2025, arXiv 2507.18071; docs/GRPO_MATH.md §1.5, T6):

        s_i = (π_θ(o_i|q) / π_old(o_i|q))^{1/|o_i|} = exp( (1/|o_i|) Σ_t (logp − sg(logp_old))_{i,t} )

    logp, logp_old, mask: [..., T] -> s: [...]. A sequence with no valid tokens gets s = 1.
    Differentiable in logp: ∂s_i/∂logp_{i,t} = s_i/|o_i|.
    """
    chex.assert_equal_shape([logp, logp_old, mask])
    return jnp.exp(jnp.clip(gspo_log_ratio(logp, logp_old, mask), -LOG_CLAMP, LOG_CLAMP))


def gspo_token_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO-token per-token ratio (Zheng et al. 2025, §4.3; docs/GRPO_MATH.md §1.5):

        s_{i,t} = sg[s_i] · π_θ(o_{i,t}) / sg[π_θ(o_{i,t})] = sg[s_i] · exp(logp − sg(logp))

    Its VALUE equals s_i at every token; its gradient wrt logp_{i,t} is s_i (per token), so with a per-token
    mean inside each sequence and Â_{i,t} = Â_i the gradient equals GSPO's. [..., T] -> [..., T].
    """
    chex.assert_equal_shape([logp, logp_old, mask])
    lp = f32(logp)
    log_s = sg(gspo_log_ratio(logp, logp_old, mask))[..., None]
    return jnp.exp(jnp.clip(log_s + lp - sg(lp), -LOG_CLAMP, LOG_CLAMP))


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
    m = f32(mask)
    lr = jnp.clip(sg(f32(log_ratio)), -20.0, 20.0)
    seq = jnp.sum(lr * m, axis=-1, keepdims=True)
    if is_ratio is not None:
        seq = seq + jnp.sum(jnp.clip(jnp.log(sg(f32(is_ratio))), lower, 20.0), axis=-1, keepdims=True)
    log_w = jnp.clip(seq, lower, 20.0)
    w = jnp.exp(log_w)
    a = sg(f32(adv))
    pos = a >= 0
    k = jnp.where(pos, k_pos, k_neg)
    lam = jnp.maximum(jnp.where(pos, lambda_pos, lambda_neg), 1e-4)
    phi = jnp.exp(lam + k * log_w - lam * w)
    return sg(jnp.where(jnp.isfinite(phi), phi, 0.0))


def is_weight(
    lp_old: jax.Array,
    lp_b: jax.Array,
    m: jax.Array,
    *,
    tis_level: str,
    tis_mode: str,
    tis_min: float | None,
    tis_cap: float | None,
) -> jax.Array:
    """TRL's vLLM importance-sampling correction: exp((π_old − π_behaviour) log-prob differences), per token
    or summed per sequence, truncated to [C_min, C_max] or masked to 0 outside it. Stop-gradient."""
    d = jnp.where(m > 0, lp_old - lp_b, 0.0)
    d = jnp.where(jnp.isnan(d), 0.0, d)  # tokens the sampler could not score: no correction
    if tis_level == "sequence":
        d = jnp.sum(d, axis=-1, keepdims=True)
    w = jnp.exp(jnp.clip(d, -LOG_CLAMP, LOG_CLAMP))
    lo = -jnp.inf if tis_min is None else tis_min
    hi = jnp.inf if tis_cap is None else tis_cap
    if tis_mode == "truncate":
        w = jnp.clip(w, lo, hi)
    else:
        w = jnp.where((w < lo) | (w > hi), 0.0, w)
    return sg(w)


# ------------------------------------------------------------------------------------------------------------
# the policy terms, one function each, dispatched by name (SURROGATES)
# ------------------------------------------------------------------------------------------------------------


class SurrogateInputs(NamedTuple):
    """What a policy term may use, per token [..., T] (padding already zeroed) unless stated."""

    log_ratio: jax.Array  # log ρ at the importance level ([..., T], or [..., 1] per sequence); differentiable
    ratio: jax.Array  # exp(clip(log_ratio, ±LOG_CLAMP))
    adv: jax.Array  # the advantage at the ratio's level ([..., 1] or [..., T]), stop-gradient
    adv_token: jax.Array  # the advantage as given ([..., 1] per sequence or [..., T] per token)
    logp: jax.Array  # current log-probs (differentiable)
    logp_old: jax.Array  # π_old's log-probs (stop-gradient)
    mask: jax.Array  # valid tokens (float32)
    is_ratio: jax.Array | None  # the IS-correction weight (VESPO folds it into φ), or None
    logp_behaviour: jax.Array | None = None  # the sampler's log-probs (stop-gradient), when given


class SurrogateOut(NamedTuple):
    """A policy term: the objective to MAXIMISE (broadcastable to [..., T]), the clip indicators (None: the
    term never clips on that side) and a per-sequence weight φ (None: 1)."""

    objective: jax.Array
    low: jax.Array | None = None
    high: jax.Array | None = None
    phi: jax.Array | None = None


def clip(x: SurrogateInputs, *, eps_low, eps_high, dual_clip=None, delta=None) -> SurrogateOut:
    """PPO / GRPO: J = min(ρA, clip(ρ, 1 − eps_low, 1 + eps_high)A) (+ dual clip, two-sided δ), see
    `clipped_surrogate`."""
    objective, aux = _surrogate_from_log_ratio(
        x.log_ratio, x.adv, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip, delta=delta
    )
    return SurrogateOut(objective, aux.is_low_clipped, aux.is_high_clipped)


def cispo(x: SurrogateInputs, *, eps_high) -> SurrogateOut:
    """CISPO (MiniMax-M1, arXiv 2506.13585; TRL loss_type="cispo"): J = sg(min(ρ, ε_max))·A·logp, every
    token keeps a gradient (the IS weight is clipped and detached, never the token). `eps_high` is the cap
    ε_max itself (e.g. 5); `high` marks tokens whose ratio exceeds it with A > 0."""
    objective = sg(jnp.minimum(x.ratio, eps_high)) * x.adv * x.logp
    high = ((x.ratio > eps_high) & (x.adv > 0)).astype(jnp.float32)
    return SurrogateOut(objective, high=high)


def sapo(x: SurrogateInputs, *, sapo_temp_pos, sapo_temp_neg) -> SurrogateOut:
    """SAPO (Qwen, arXiv 2511.20347; TRL loss_type="sapo"): a soft gate instead of the hard clip,
    J = σ(τ(ρ − 1))·4/τ·A with τ = sapo_temp_pos where A > 0, else sapo_temp_neg (∂J/∂ρ = A at ρ = 1)."""
    tau = jnp.where(x.adv > 0, sapo_temp_pos, sapo_temp_neg)
    return SurrogateOut(jax.nn.sigmoid(tau * (x.ratio - 1.0)) * 4.0 / tau * x.adv)


def vespo(
    x: SurrogateInputs, *, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg
) -> SurrogateOut:
    """VESPO (TRL loss_type="vespo"): J = sg(φ(w))·A·logp with φ the gamma weight of the sequence ratio w
    (`vespo_weights`, from the TOKEN log ratios and the token IS ratio whatever the importance level)."""
    phi = vespo_weights(
        x.adv_token,
        x.logp - x.logp_old,
        x.mask,
        x.is_ratio,
        k_pos=vespo_k_pos,
        lambda_pos=vespo_lambda_pos,
        k_neg=vespo_k_neg,
        lambda_neg=vespo_lambda_neg,
    )
    return SurrogateOut(phi * x.adv_token * x.logp, phi=phi)


DPPO_DIVERGENCES = ("tv", "kl")


def dppo(x: SurrogateInputs, *, mask_low, mask_high, divergence, kl_coef) -> SurrogateOut:
    """DPPO, Divergence PPO (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
    arXiv 2602.04879; prime-rl's default loss, also verl dppo_tv / dppo_kl and SkyRL "dppo"). No clipped
    ratio: a token's policy term is DROPPED when its PROBABILITY moved too far from the sampler's μ in the
    direction its advantage pushes it (a binary trust region on the sampled token vs the rest), and a
    squared log-ratio to μ regularises every token (prime-rl's KL term, after Kimi K2.5):

        r = exp(log π − log μ)      (differentiable in log π; log r clamped to ±LOG_CLAMP inside exp)
        tv:  drop  A > 0 and π − μ > mask_high,   or  A ≤ 0 and π − μ < −mask_low       (prime-rl)
        kl:  D = μ log(μ/π) + (1 − μ) log((1 − μ + 1e-8)/(1 − π + 1e-8)) (the Bernoulli KL, SkyRL / verl);
             drop  A > 0, π > μ, D > mask_high,   or  A < 0, π < μ, D > mask_low
        J  = K·A·r − kl_coef·(log r)²           K = 1 − dropped

    so the loss −J is prime-rl's ℓ = −K·A·r + τ_KL·(log r)² (per token, before aggregation). The masks use π
    and μ as values (no gradient through the comparison). `low` / `high` mark the dropped tokens by side.
    Needs the sampler's log-probs (`logp_behaviour`)."""
    if x.logp_behaviour is None:
        raise ValueError("dppo: the trust region is measured against the sampler: logp_behaviour is needed")
    if divergence not in DPPO_DIVERGENCES:
        raise ValueError(f"dppo: divergence={divergence!r}; valid: {', '.join(DPPO_DIVERGENCES)}")
    log_r = x.logp - x.logp_behaviour
    ratio = jnp.exp(jnp.clip(log_r, -LOG_CLAMP, LOG_CLAMP))
    p, mu = jnp.exp(sg(x.logp)), jnp.exp(x.logp_behaviour)
    diff = p - mu
    if divergence == "tv":
        high = (x.adv > 0) & (diff > mask_high)
        low = (x.adv <= 0) & (diff < -mask_low)
    else:
        eps = 1e-8
        d = mu * (x.logp_behaviour - sg(x.logp)) + (1.0 - mu) * jnp.log((1.0 - mu + eps) / (1.0 - p + eps))
        high = (x.adv > 0) & (diff > 0) & (d > mask_high)
        low = (x.adv < 0) & (diff < 0) & (d > mask_low)
    keep = 1.0 - (high | low).astype(jnp.float32)
    objective = keep * x.adv * ratio - kl_coef * jnp.square(log_r)
    return SurrogateOut(objective, low.astype(jnp.float32), high.astype(jnp.float32))


class Surrogate(NamedTuple):
    """A policy term of SURROGATES: its function, the PolicyLossConfig fields it takes as keyword arguments
    (same names), and whether it folds the IS-correction weight into its own φ (then the loss does not
    multiply it again)."""

    fn: Callable[..., SurrogateOut]
    params: tuple[str, ...]
    folds_is_weight: bool = False


# --objective=NAME -> its policy term (a new term: one function above and one entry here)
SURROGATES: dict[str, Surrogate] = {
    "clip": Surrogate(clip, ("eps_low", "eps_high", "dual_clip", "delta")),
    "cispo": Surrogate(cispo, ("eps_high",)),
    "sapo": Surrogate(sapo, ("sapo_temp_pos", "sapo_temp_neg")),
    "vespo": Surrogate(
        vespo, ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"), folds_is_weight=True
    ),
}
OBJECTIVES = tuple(SURROGATES)  # what --objective selects
# the policy terms of an algorithm of their own (--algorithm=dppo), called with the algorithm's parameters
ALGORITHM_TERMS: dict[str, Surrogate] = {
    "dppo": Surrogate(dppo, ("mask_low", "mask_high", "divergence", "kl_coef")),
}
