"""Small masked reductions: `masked_mean`, `masked_std`, `explained_variance`, `global_norm` (jnp,
jit/vmap-safe).

The rest of `grpo_jax.core` uses them. pass@k (host-side NumPy on evaluation counts) lives in
`grpo_jax.codegen.passk` (NumPy only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
