"""grpo_jax.codegen.passk (pass@k, docs/GRPO_MATH.md §5) and grpo_jax.core.metrics against literal values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.codegen import passk as P
from grpo_jax.core import metrics as M

ATOL = 1e-5

# n, c, k, unbiased, naive — every §5 row
PASS_ROWS = [
    (10, 3, 1, 0.300000, 0.300000),
    (10, 3, 2, 0.533333, 0.510000),
    (10, 3, 5, 0.916667, 0.831930),
    (10, 0, 5, 0.0, 0.0),
    (10, 8, 5, 1.0, 0.999680),
    (5, 2, 3, 0.900000, 0.784000),
    (200, 10, 1, 0.050000, 0.050000),
    (200, 10, 10, 0.408548, 0.401263),
    (200, 10, 100, 0.999229, 0.994079),
]


@pytest.mark.parametrize("n, c, k, unbiased, naive", PASS_ROWS)
def test_pass_at_k_table(n, c, k, unbiased, naive):
    assert isinstance(P.pass_at_k(n, c, k), float)
    np.testing.assert_allclose(P.pass_at_k(n, c, k), unbiased, atol=ATOL)
    np.testing.assert_allclose(P.pass_at_k_naive(n, c, k), naive, atol=ATOL)
    assert P.pass_at_k_naive(n, c, k) <= P.pass_at_k(n, c, k) + 1e-12  # naive is biased low


def test_pass_at_k_facts_and_mean():
    for n in (1, 5, 10):
        for c in range(n + 1):
            np.testing.assert_allclose(P.pass_at_k(n, c, 1), c / n, atol=1e-12)
    np.testing.assert_allclose(P.mean_pass_at_k([10, 10], [3, 0], 5), 0.458333, atol=ATOL)
    np.testing.assert_allclose(P.mean_pass_at_k(10, [3, 0], 5), 0.458333, atol=ATOL)


@pytest.mark.parametrize("n, c, k", [(5, 2, 6), (5, 6, 1), (-1, 0, 1), (5, -1, 1), (5, 2, 0), (5, 2, -1)])
def test_pass_at_k_errors(n, c, k):
    with pytest.raises(ValueError):
        P.pass_at_k(n, c, k)
    with pytest.raises(ValueError):
        P.pass_at_k_naive(n, c, k)
    with pytest.raises(ValueError):
        P.mean_pass_at_k([n], [c], k)


def test_mean_pass_at_k_length_mismatch():
    with pytest.raises(ValueError, match="one n per problem"):
        P.mean_pass_at_k([10, 10], [3], 1)


def test_masked_mean_and_std():
    x = jnp.array([[1.0, 2.0, 3.0, 100.0], [4.0, 4.0, 0.0, 0.0]])
    m = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    np.testing.assert_allclose(M.masked_mean(x, m), 14.0 / 5.0, atol=ATOL)
    np.testing.assert_allclose(M.masked_mean(x, m, axis=-1), [2.0, 4.0], atol=ATOL)
    np.testing.assert_allclose(M.masked_std(x, m, axis=-1), [np.sqrt(2.0 / 3.0), 0.0], atol=ATOL)
    np.testing.assert_allclose(M.masked_std(x, m, ddof=1, axis=-1), [1.0, 0.0], atol=ATOL)
    # all masked: 0, never NaN (value and gradient)
    z = jnp.zeros_like(m)
    assert float(M.masked_mean(x, z)) == 0.0 and float(M.masked_std(x, z)) == 0.0
    g = jax.grad(lambda v: M.masked_std(v, m, axis=-1).sum())(x)
    assert np.all(np.isfinite(g))
    # jit == no-jit
    np.testing.assert_allclose(jax.jit(M.masked_mean)(x, m), 14.0 / 5.0, atol=ATOL)
    f = jax.jit(lambda a, b: M.masked_std(a, b, ddof=1, axis=-1))
    np.testing.assert_allclose(f(x, m), [1.0, 0.0], atol=ATOL)


def test_global_norm():
    tree = {"a": jnp.array([3.0, 4.0]), "b": (jnp.array([[12.0]], jnp.bfloat16),)}
    np.testing.assert_allclose(M.global_norm(tree), 13.0, atol=ATOL)
    np.testing.assert_allclose(jax.jit(M.global_norm)(tree), 13.0, atol=ATOL)
    assert float(M.global_norm({})) == 0.0
