"""PPO for a language model: KL-shaped per-token rewards, GAE, value targets and the clipped value loss
(docs/GRPO_MATH.md §2, T8). Pure jnp; the PPO algorithm (grpo_jax.algorithms.ppo) builds on it."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from grpo_jax.core.advantages import whiten
from grpo_jax.core.kl import kl_penalty
from grpo_jax.core.metrics import f32, masked_mean

sg = jax.lax.stop_gradient


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
    r = f32(rewards)
    v = f32(values)
    m = jnp.asarray(mask, jnp.float32)
    chex.assert_equal_shape([r, v, m])
    lead = r.shape[:-1]
    lv = jnp.zeros(lead, jnp.float32) if last_value is None else jnp.broadcast_to(f32(last_value), lead)

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
    lp = f32(logp)
    chex.assert_equal_shape([lp, f32(logp_ref), m])
    s = f32(scores)
    chex.assert_shape(s, lp.shape[:-1])
    T = lp.shape[-1]
    per_tok = -f32(kl_coef) * kl_penalty(lp, logp_ref, kind=kind) * m
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
    """PPO clipped value loss (TRL ppo_trainer.py; docs/GRPO_MATH.md §2, T8):

        L_V = 0.5 · mean_t max( (V − R̂)², (clip(V, V_old − ε_v, V_old + ε_v) − R̂)² )

    values [..., T] (differentiated), values_old, returns [..., T] (stop-gradient'ed), mask [..., T].
    num_items: the token count the mean divides by (default the mask's; a micro-batch of a bigger batch
    passes the whole batch's, so the micro-batch losses sum to the batch's, as the policy loss's num_items).
    Returns (loss scalar, clip_frac = masked fraction of tokens where the clipped error is the larger).
    T8: V_old 0.5, V 0.9, R̂ 1.0, ε_v 0.2 -> 0.5·max(0.01, 0.09) = 0.045.
    """
    v = f32(values)
    v_old = sg(f32(values_old))
    ret = sg(f32(returns))
    m = jnp.asarray(mask, jnp.float32)
    chex.assert_equal_shape([v, v_old, ret, m])
    v_clip = jnp.clip(v, v_old - eps_v, v_old + eps_v)
    unclipped = jnp.square(v - ret)
    clipped = jnp.square(v_clip - ret)
    worst = jnp.where(m > 0, jnp.maximum(unclipped, clipped), 0.0)  # padding garbage never reaches the loss
    if num_items is None:
        loss = 0.5 * masked_mean(worst, m)
    else:
        loss = 0.5 * jnp.sum(worst * m) / jnp.maximum(f32(num_items), 1.0)
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
    """PPO's per-token advantages and value targets for a language model (docs/GRPO_MATH.md §2; TRL
    ppo_trainer.py, the RLHF recipe of Ziegler et al. 2019):

        r_t  = −kl_coef · k(logp_old_t, logp_ref_t)   (+ score on the last valid token)   `kl_shaped_rewards`
        Â, R̂ = GAE(r, V_old; γ, λ) with V after the last valid token = 0                 `gae`
        Â    ← whiten(Â) over every valid token of the batch (masked mean / Bessel var, eps 1e-8)  `whiten`

    scores [...] (the terminal reward of each sequence), values_old [..., T] (the critic at the rollout's
    parameters), mask [..., T] prefix masks of the valid tokens; logp_old / logp_ref [..., T] or None (no
    reference: no KL term, only the score). R̂ comes from the un-whitened Â, as in TRL.
    """
    m = jnp.asarray(mask, jnp.float32)
    v = jnp.where(m > 0, sg(f32(values_old)), 0.0)
    if logp_ref is None:
        lp = lr = jnp.zeros_like(m)
        kl_coef = 0.0
    else:
        if logp_old is None:
            raise ValueError("ppo_token_advantages: logp_ref needs logp_old (the rollout policy's log-probs)")
        lp = jnp.where(m > 0, sg(f32(logp_old)), 0.0)
        lr = jnp.where(m > 0, sg(f32(logp_ref)), 0.0)
    rewards = kl_shaped_rewards(scores, lp, lr, m, kl_coef=sg(f32(kl_coef)), kind=kl_kind)
    adv, returns = gae(rewards, v, m, gamma=gamma, lam=lam)
    if whiten_advantages:
        adv = whiten(adv, m) * m
    return PPOTargets(adv=sg(adv), returns=sg(returns), rewards=rewards)
