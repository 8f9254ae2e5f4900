"""The policy loss every algorithm builds on (docs/GRPO_MATH.md §1, §4 T2–T7, T5): a policy term from
grpo_jax.core.surrogates at the configured importance level, the IS correction, the off-policy and
top-entropy masks, a KL term and an entropy bonus, aggregated (grpo_jax.core.aggregation). The configuration
is `grpo_jax.config.PolicyLossConfig` (static: one compiled loss per configuration); the math is core's.

    x = PolicyInputs(logp, logp_old, logp_ref, adv, mask, entropy=None, logp_behaviour=None)
    loss, aux = policy_loss(x, cfg=cfg, kl_coef=β, entropy_coef=c, num_items=None, term=None)

Sign convention: the LOSS (= −J, to minimise). `logp_old`, `logp_ref`, `logp_behaviour` and the advantages are
stop-gradient'ed inside, so `jax.grad(loss)(logp)` is the gradient the trainer applies.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from grpo_jax.config import PolicyLossConfig
from grpo_jax.core.aggregation import aggregate
from grpo_jax.core.kl import kl_penalty
from grpo_jax.core.metrics import LOG_CLAMP, f32, masked_mean, masked_quantile
from grpo_jax.core.surrogates import SURROGATES, Surrogate, SurrogateInputs, gspo_log_ratio, is_weight

sg = jax.lax.stop_gradient


class PerTokenTerms(NamedTuple):
    """Per-token intermediates of `policy_per_token_loss`, each [..., T] float32."""

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
    """Scalar diagnostics of `policy_loss` (masked token means unless stated)."""

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
    phi_seq_mean: jax.Array  # VESPO: mean of φ over the sequences (TRL vespo/phi_seq_mean; 1 for others)


class PolicyInputs(NamedTuple):
    """The per-token inputs of the policy loss, as `policy_loss` describes them: logp, logp_old [..., T],
    logp_ref [..., T] or None, adv [...] or [..., T], mask [..., T], entropy [..., T] or None, logp_behaviour
    [..., T] or None (the sampler's)."""

    logp: jax.Array
    logp_old: jax.Array
    logp_ref: jax.Array | None
    adv: jax.Array
    mask: jax.Array
    entropy: jax.Array | None = None
    logp_behaviour: jax.Array | None = None


def policy_per_token_loss(
    x: PolicyInputs,
    *,
    cfg: PolicyLossConfig,
    kl_coef: jax.Array | float,
    entropy_coef: jax.Array | float,
    entropy_threshold: jax.Array | None = None,
    term: Surrogate | None = None,
    term_params: dict | None = None,
) -> tuple[jax.Array, PerTokenTerms]:
    """Per-token GRPO loss ℓ_{i,t} before aggregation (arguments as `policy_loss`), in TRL 1.16's order
    (grpo_trainer.py::_compute_loss):

        ℓ = P·M_off·M_H·W + kl_coef·KL  [− entropy_coef·H with entropy_bonus="aggregate"]

    P the objective's policy term at cfg.importance_level (clip: −min(ρA, clip(ρ)A); cispo, sapo, vespo: see
    PolicyLossConfig.objective), M_off the off-policy sequence mask, M_H the top-entropy mask, W the IS
    correction (folded into φ for vespo instead), KL the cfg.kl_estimator estimate (× the importance ratio
    with kl_bias_correction: the sequence ratio s_i at importance_level="sequence", as TRL). The KL is not
    masked or weighted.
    Returns (per_token_loss [..., T], PerTokenTerms). Padding is made harmless: every per-token input is
    replaced by 0 where mask == 0 before use, so garbage there (−inf, NaN) reaches neither the loss nor the
    gradient; the aggregation then masks those positions out.
    """
    logp, logp_old, logp_ref, adv, mask, entropy, logp_behaviour = x
    m = jnp.asarray(mask, jnp.float32)  # [..., T]
    valid = m > 0

    def clean(x):  # [..., T] -> float32 with padding zeroed (value AND gradient stay finite)
        x = f32(x)
        chex.assert_equal_shape([x, m])
        return jnp.where(valid, x, 0.0)

    lp = clean(logp)  # [..., T]
    lp_old = sg(clean(logp_old))  # [..., T]
    a = sg(f32(adv))
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
        log_w = gspo_log_ratio(lp, lp_old, m)[..., None]  # [..., 1]
        # GSPO: one ratio and one clip decision per sequence; the sequence advantage is the mean of a over
        # valid tokens (equals Â_i when adv is per sequence).
        a_w = masked_mean(a_tok, m, axis=-1)[..., None] if a.shape == lp.shape else a
    else:  # sequence_token
        log_w = sg(gspo_log_ratio(lp, lp_old, m))[..., None] + lp - sg(lp)
        a_w = a
    ratio = jnp.exp(jnp.clip(log_w, -LOG_CLAMP, LOG_CLAMP))

    behaviour = None if logp_behaviour is None else sg(clean(logp_behaviour))
    is_w = None
    if cfg.tis_enabled:
        if behaviour is None:
            raise ValueError(
                "policy_loss: the IS correction (tis_cap / tis_min) is on, so logp_behaviour (the sampler's "
                "log-probs) is needed."
            )
        is_w = is_weight(
            lp_old,
            behaviour,
            m,
            tis_level=cfg.tis_level,
            tis_mode=cfg.tis_mode,
            tis_min=cfg.tis_min,
            tis_cap=cfg.tis_cap,
        )

    zero = jnp.zeros_like(lp)
    if term is None:
        term = SURROGATES[cfg.objective]
        term_params = {name: getattr(cfg, name) for name in term.params}
    elif term_params is None:
        raise ValueError("policy_loss: term= needs its term_params= (a dict, {} for none)")
    inputs = SurrogateInputs(log_w, ratio, a_w, a, lp, lp_old, m, is_w, behaviour)
    out = term.fn(inputs, **term_params)
    surrogate = jnp.broadcast_to(out.objective, lp.shape)
    low = zero if out.low is None else out.low
    high = zero if out.high is None else out.high
    phi = ones if out.phi is None else out.phi

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
            raise ValueError("policy_loss: top_entropy_quantile < 1 needs the per-token entropy")
        thr = masked_quantile(sg(ent), m, 1.0 - cfg.top_entropy_quantile)
        if entropy_threshold is not None:  # the whole batch's quantile, for a micro-batch of it
            thr = sg(f32(entropy_threshold))
        ent_mask = ((sg(ent) * m >= thr) & valid).astype(jnp.float32)
    isw = ones if is_w is None or term.folds_is_weight else jnp.broadcast_to(is_w, lp.shape)
    weight = off * (ent_mask if cfg.top_entropy_quantile < 1.0 else ones) * isw

    anchor = logp_ref if cfg.kl_anchor == "ref" else lp_old
    if anchor is None:
        kl = zero
    else:
        anchor = clean(anchor)
        kl = kl_penalty(lp, anchor, kind=cfg.kl_estimator)
        if cfg.kl_bias_correction:
            kl = kl * ratio  # the importance ratio of cfg.importance_level (s_i broadcast for "sequence")

    bonus = f32(entropy_coef) * ent if cfg.entropy_bonus == "aggregate" else zero
    per_token = -(weight * surrogate) + f32(kl_coef) * kl - bonus
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


def policy_loss(
    x: PolicyInputs,
    *,
    cfg: PolicyLossConfig,
    kl_coef: jax.Array | float,
    entropy_coef: jax.Array | float,
    num_items: jax.Array | float | None = None,
    num_seqs: int | None = None,
    entropy_threshold: jax.Array | None = None,
    entropy_items: jax.Array | None = None,
    term: Surrogate | None = None,
    term_params: dict | None = None,
) -> tuple[jax.Array, LossAux]:
    """GRPO loss (DeepSeekMath eq. 3–4, arXiv 2402.03300; variants DAPO / Dr. GRPO / GSPO / LUSPO / CISPO /
    SAPO / VESPO; TRL 1.16 grpo_trainer.py::_compute_loss; docs/GRPO_MATH.md §1, T5):

        ℓ_{i,t} = see policy_per_token_loss (clip: −w·min(ρA, clip(ρ, 1−ε_l, 1+ε_h)A) + kl_coef·KL − ...)
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
    entropy_coef are traced scalars (controllers change them without recompiling). `term` / `term_params`:
    an algorithm's own policy term (core.surrogates.ALGORITHM_TERMS, e.g. DPPO) with its parameters, in place
    of cfg.objective's. Returns (loss, LossAux).
    """
    logp, logp_old, logp_ref, adv, mask, entropy, logp_behaviour = x
    per_token, t = policy_per_token_loss(
        x,
        cfg=cfg,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        entropy_threshold=entropy_threshold,
        term=term,
        term_params=term_params,
    )
    m = jnp.asarray(mask, jnp.float32)
    agg = functools.partial(
        aggregate, mode=cfg.aggregation, max_len=cfg.max_len, token_count=num_items, num_seqs=num_seqs
    )
    loss = agg(per_token, m)
    if cfg.entropy_bonus == "token_mean":
        eff = m * t.entropy_mask
        n_eff = jnp.sum(eff) if entropy_items is None else f32(entropy_items)
        loss = loss - f32(entropy_coef) * jnp.sum(t.entropy * eff) / jnp.maximum(n_eff, 1.0)
    pg_loss = agg(-(t.weight * t.surrogate), m)
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
        phi_seq_mean=jnp.sum(t.phi[..., 0]) / n_seq,
    )
    return loss, jax.tree_util.tree_map(sg, aux)
