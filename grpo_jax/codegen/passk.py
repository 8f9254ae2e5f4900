"""pass@k on evaluation counts (host side, NumPy only, no JAX).

`pass_at_k` is the unbiased estimator (Chen et al. 2021), `pass_at_k_naive` the biased plug-in for
comparison, `mean_pass_at_k` the benchmark score over problems. docs/GRPO_MATH.md §5 has the worked table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

__all__ = ["mean_pass_at_k", "pass_at_k", "pass_at_k_naive"]


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

    n: samples drawn, c: correct samples, k: budget. docs/GRPO_MATH.md §5.
    Raises ValueError if any argument is negative, k < 1, k > n or c > n.
    """
    n, c, k = _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_naive(n: int, c: int, k: int) -> float:
    """Naive plug-in estimator 1 − (1 − c/n)^k; biased LOW for k > 1 (docs/GRPO_MATH.md §5); for
    comparison."""
    n, c, k = _check_nck(n, c, k)
    return float(1.0 - (1.0 - c / n) ** k)


def mean_pass_at_k(ns: int | Sequence[int], cs: Sequence[int], k: int) -> float:
    """Benchmark score: mean over problems of `pass_at_k(n_j, c_j, k)`. `ns` may be one int for all problems.

    Example (docs/GRPO_MATH.md §5): problems (n=10, c=3) and (n=10, c=0) at k=5 give (0.916667 + 0)/2 =
    0.458333.
    """
    cs = list(cs)
    # casts: np.isscalar's TypeIs narrows int | Sequence[int] to neither branch's type
    ns = [int(cast(int, ns))] * len(cs) if np.isscalar(ns) else list(cast(Sequence[int], ns))
    if len(ns) != len(cs):
        raise ValueError(f"mean_pass_at_k needs one n per problem; got {len(ns)} ns and {len(cs)} cs.")
    if not cs:
        raise ValueError("mean_pass_at_k needs at least one problem; got none.")
    return float(np.mean([pass_at_k(n, c, k) for n, c in zip(ns, cs, strict=True)]))
