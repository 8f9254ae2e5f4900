"""Evaluation metrics (pass@k) and small masked reductions.

`pass_at_k` and friends are host-side NumPy (they run on evaluation counts, never inside a jit).
`masked_mean`, `masked_std` and `global_norm` are jnp, jit/vmap-safe; the rest of `grpo_jax.core` uses them.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

# ------------------------------------------------------------------------------------------------------------
# pass@k (host side, NumPy)
# ------------------------------------------------------------------------------------------------------------


def _check_nck(n: int, c: int, k: int) -> tuple[int, int, int]:
    n, c, k = int(n), int(c), int(k)
    if n < 0 or c < 0 or k < 0:
        raise ValueError(f"pass@k needs non-negative n, c, k; got n={n}, c={c}, k={k}.")
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1; got k={k}.")
    if k > n:
        raise ValueError(f"pass@k needs k <= n (draw at least k samples); got n={n}, k={k}.")
    if c > n:
        raise ValueError(f"pass@k needs c <= n (correct samples cannot exceed samples); got n={n}, c={c}.")
    return n, c, k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem (Chen et al. 2021, arXiv 2107.03374, the paper's NumPy form).

        pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1..n} (1 − k/i)      (1.0 when n − c < k)

    n: samples drawn, c: correct samples, k: budget. GRPO_MATH.md §5.
    Raises ValueError if any argument is negative, k < 1, k > n or c > n.
    """
    n, c, k = _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_naive(n: int, c: int, k: int) -> float:
    """Naive plug-in estimator 1 − (1 − c/n)^k; biased LOW for k > 1 (GRPO_MATH.md §5); for comparison."""
    n, c, k = _check_nck(n, c, k)
    return float(1.0 - (1.0 - c / n) ** k)


def mean_pass_at_k(ns: int | Sequence[int], cs: Sequence[int], k: int) -> float:
    """Benchmark score: mean over problems of `pass_at_k(n_j, c_j, k)`. `ns` may be one int for all problems.

    Example (GRPO_MATH.md §5): problems (n=10, c=3) and (n=10, c=0) at k=5 give (0.916667 + 0)/2 = 0.458333.
    """
    cs = list(cs)
    ns = [int(ns)] * len(cs) if np.isscalar(ns) else list(ns)
    if len(ns) != len(cs):
        raise ValueError(f"mean_pass_at_k needs one n per problem; got {len(ns)} ns and {len(cs)} cs.")
    if not cs:
        raise ValueError("mean_pass_at_k needs at least one problem; got none.")
    return float(np.mean([pass_at_k(n, c, k) for n, c in zip(ns, cs, strict=True)]))


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


def global_norm(tree) -> jax.Array:
    """sqrt(Σ over all leaves of Σ leaf²), accumulated in float32 (like optax.global_norm)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in leaves))
