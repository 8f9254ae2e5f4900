"""KL estimators from sampled-token log-probs (docs/GRPO_MATH.md §1.1, T3). Pure jnp, jit/vmap-safe."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.core.metrics import LOG_CLAMP, f32

sg = jax.lax.stop_gradient

KL_KINDS = ("k1", "k2", "k3")
KL_ANCHORS = ("ref", "old")


def kl_penalty(logp: jax.Array, logp_anchor: jax.Array, *, kind: str = "k3") -> jax.Array:
    """Per-token KL estimate of KL[π_θ || π_anchor] from sampled-token log-probs (Schulman, "Approximating
    KL divergence", 2020; DeepSeekMath eq. 4 uses k3; docs/GRPO_MATH.md §1.1, T3):

        Δ = logp_anchor − logp
        k1 = −Δ          k2 = Δ²/2          k3 = exp(Δ) − Δ − 1   (≥ 0; ∂k3/∂logp = 1 − exp(Δ))

    Shapes: any, broadcast together. The anchor is stop-gradient'ed (it is π_ref or π_old, never trained).
    Safety: for k3 the argument of exp is clamped to [−20, 20] (only inside exp), so the value is finite
    for any input; the gradient is exact inside that range and stays finite outside it.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kl_penalty: unknown kind {kind!r}; valid kinds are {KL_KINDS}.")
    delta = sg(f32(logp_anchor)) - f32(logp)
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * jnp.square(delta)
    return jnp.exp(jnp.clip(delta, -LOG_CLAMP, LOG_CLAMP)) - delta - 1.0
