"""Small masked reductions and numeric helpers: `masked_mean`, `masked_std`, `masked_quantile`,
`explained_variance`, `global_norm`, `f32`, `LOG_CLAMP` (jnp, jit/vmap-safe).

The rest of `grpo_jax.core` uses them. pass@k (host-side NumPy on evaluation counts) lives in
`grpo_jax.codegen.passk` (NumPy only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# exp() arguments are clamped to this range: exp(20) ≈ 4.9e8 is finite in float32 (max ≈ 3.4e38, and still
# finite after multiplying by an advantage or summing over a batch), while anything beyond it means the policy
# moved so far from its anchor that the exact value is meaningless anyway.
LOG_CLAMP = 20.0


def f32(x) -> jax.Array:
    """x as a float32 array (every loss input is cast on entry)."""
    return jnp.asarray(x, jnp.float32)


# ------------------------------------------------------------------------------------------------------------
# Masked reductions (jnp, jit/vmap-safe)
# ------------------------------------------------------------------------------------------------------------


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Σ(x·m) / max(Σm, 1) over `axis` (all axes if None), in float32. `mask` broadcasts against `x`.

    An all-masked reduction gives 0, never NaN.
    """
    x = jnp.asarray(x, jnp.float32)
    m = jnp.broadcast_to(jnp.asarray(mask, jnp.float32), x.shape)
    return (x * m).sum(axis) / jnp.maximum(m.sum(axis), 1.0)


def masked_std(x: jax.Array, mask: jax.Array, *, ddof: int = 0, axis=None) -> jax.Array:
    """sqrt( Σ m·(x − mean)² / max(Σm − ddof, 1) ) over `axis` (all if None), float32.

    `ddof=0` is the population std (jnp.std's default), `ddof=1` the sample std (torch.std's default).
    With fewer than ddof+1 valid entries the result is 0 (not NaN). The sqrt is guarded so its gradient at 0
    is 0, not NaN.
    """
    x = jnp.asarray(x, jnp.float32)
    m = jnp.broadcast_to(jnp.asarray(mask, jnp.float32), x.shape)
    mean = masked_mean(x, m, axis=axis)
    mean_b = mean if axis is None else jnp.expand_dims(mean, axis)
    ss = (jnp.square(x - mean_b) * m).sum(axis)
    var = ss / jnp.maximum(m.sum(axis) - ddof, 1.0)
    var = jnp.where(m.sum(axis) > ddof, var, 0.0)
    safe = jnp.where(var > 0, var, 1.0)
    return jnp.where(var > 0, jnp.sqrt(safe), 0.0)


def explained_variance(pred: jax.Array, target: jax.Array, mask: jax.Array) -> jax.Array:
    """1 − Var_m(target − pred) / Var_m(target) over the valid entries (population variances; the critic's
    explained variance as Stable-Baselines3 logs it: 1 = perfect, 0 = no better than a constant, < 0
    worse). 0 when the target has no variance (undefined there; 0, never NaN, so logs stay finite)."""
    target = jnp.asarray(target, jnp.float32)
    var_t = jnp.square(masked_std(target, mask))
    var_r = jnp.square(masked_std(target - jnp.asarray(pred, jnp.float32), mask))
    return jnp.where(var_t > 0, 1.0 - var_r / jnp.where(var_t > 0, var_t, 1.0), 0.0)


def global_norm(tree) -> jax.Array:
    """sqrt(Σ over all leaves of Σ leaf²), accumulated in float32 (like optax.global_norm)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in leaves))


def masked_quantile(x: jax.Array, mask: jax.Array, q: float) -> jax.Array:
    """The q-quantile of x over mask > 0, linear interpolation between order statistics (torch.quantile's
    default): position q·(n − 1) of the sorted valid values. Any shapes (flattened); NaN when n = 0."""
    xm = jnp.where(jnp.asarray(mask) > 0, f32(x), jnp.inf).ravel()
    n = jnp.sum(jnp.asarray(mask) > 0)
    xs = jnp.sort(xm)
    pos = jnp.float32(q) * jnp.maximum(n - 1, 0).astype(jnp.float32)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    frac = pos - lo.astype(jnp.float32)
    a, b = xs[lo], xs[hi]
    val = a + frac * jnp.where(frac > 0, b - a, 0.0)
    return jnp.where(n > 0, val, jnp.nan)
