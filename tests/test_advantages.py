"""Tests for grpo_jax.core.advantages against docs/GRPO_MATH.md §4 T1 / T1b (literal expected values)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.core import advantages as A

ATOL = 1e-5

R_1001 = [1.0, 0.0, 0.0, 1.0]
R_1000 = [1.0, 0.0, 0.0, 0.0]
R_NB = [0.5, 1.0, 0.0, 0.25]

# (rewards, fn, kwargs, expected) — every T1 row.
T1_ROWS = [
    (R_1001, A.group_zscore, dict(ddof=1, eps=0.0), [0.866025, -0.866025, -0.866025, 0.866025]),
    (R_1001, A.group_zscore, dict(ddof=1, eps=1e-4), [0.865875, -0.865875, -0.865875, 0.865875]),
    (R_1001, A.group_zscore, dict(ddof=0, eps=0.0), [1.0, -1.0, -1.0, 1.0]),
    (R_1001, A.group_mean_only, {}, [0.5, -0.5, -0.5, 0.5]),
    (R_1001, A.rloo, {}, [0.666667, -0.666667, -0.666667, 0.666667]),
    (R_1000, A.group_zscore, dict(ddof=1, eps=0.0), [1.5, -0.5, -0.5, -0.5]),
    (R_1000, A.group_zscore, dict(ddof=1, eps=1e-4), [1.4997, -0.4999, -0.4999, -0.4999]),
    (R_1000, A.group_zscore, dict(ddof=0, eps=0.0), [1.732051, -0.577350, -0.577350, -0.577350]),
    (R_1000, A.group_mean_only, {}, [0.75, -0.25, -0.25, -0.25]),
    (R_1000, A.rloo, {}, [1.0, -0.333333, -0.333333, -0.333333]),
    (R_NB, A.group_zscore, dict(ddof=1, eps=0.0), [0.146385, 1.317465, -1.024695, -0.439155]),
    (R_NB, A.group_zscore, dict(ddof=0, eps=0.0), [0.169031, 1.521278, -1.183216, -0.507093]),
    (R_NB, A.group_mean_only, {}, [0.0625, 0.5625, -0.4375, -0.1875]),
    (R_NB, A.rloo, {}, [0.083333, 0.75, -0.583333, -0.25]),
]


@pytest.mark.parametrize("r, fn, kw, expected", T1_ROWS)
def test_t1_rows(r, fn, kw, expected):
    out = fn(jnp.array(r), **kw)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, expected, atol=ATOL)
    np.testing.assert_allclose(jax.jit(lambda x: fn(x, **kw))(jnp.array(r)), expected, atol=ATOL)


@pytest.mark.parametrize("eps", [0.0, 1e-4, 1e-8])
@pytest.mark.parametrize("ddof", [0, 1])
def test_all_equal_group_is_exactly_zero(eps, ddof):
    # [0.1]*4, [0.3]*4: float32 rounding of the mean must not leak a ±1 through when eps = 0.
    r = jnp.array([[1.0] * 4, [0.0] * 4, [0.1] * 4, [0.3] * 4])  # [B=4, G=4], every group all-equal
    for out in (
        A.group_zscore(r, ddof=ddof, eps=eps),
        A.group_mean_only(r),
        A.rloo(r),
        *(A.batch_std_scaled(r[i], ddof=ddof, eps=eps) for i in range(4)),
    ):
        assert np.all(np.isfinite(out))
        np.testing.assert_array_equal(out, np.zeros(out.shape))


# The gradient of L(r) = Σ_i w_i Â_i. Weights, because Σ_i Â_i is identically 0 (so is its gradient).
W = [1.0, 2.0, 3.0, 4.0]


def _weighted_grad(r, **kw):
    return jax.grad(lambda x: (jnp.array(W) * A.group_zscore(x, **kw)).sum())(jnp.array(r, jnp.float32))


@pytest.mark.parametrize("eps", [0.0, 1e-4])
@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("r", [[1.0] * 4, [0.0] * 4, [0.3] * 4])
def test_zero_variance_gradient_is_exactly_zero(r, ddof, eps):
    # The guard selects the constant 0 for an all-equal group, so no gradient flows through it: exactly 0,
    # not NaN (eps=0: 0/0) and not the unguarded (w_k − mean(w)) / (0 + eps) = ±15000, ±5000 (eps=1e-4).
    np.testing.assert_array_equal(_weighted_grad(r, ddof=ddof, eps=eps), [0.0, 0.0, 0.0, 0.0])
    g = jax.jit(jax.grad(lambda x: A.group_zscore(x, ddof=ddof, eps=eps).sum()))(jnp.array(r))
    np.testing.assert_array_equal(g, [0.0, 0.0, 0.0, 0.0])


# (rewards, ddof, eps, dL/dr). With μ the mean, s the std, n = G − ddof:
#   dL/dr_k = (w_k − mean(w)) / (s + eps) − Σ_i w_i (r_i − μ) / (s + eps)² · (r_k − μ) / (n s)
# R_1000, ddof=1: μ = 0.25, s = 0.5, Σ w (r − μ) = −1.5; so with eps=0, by hand,
#   dL/dr = [−3, −1, 1, 3] + 6·[1/2, −1/6, −1/6, −1/6] = [0, −2, 0, 2].
# The eps=1e-4 rows agree with NumPy float64 central differences (h=1e-6) to 1e-9.
GRAD_ROWS = [
    (R_1000, 1, 0.0, [0.0, -2.0, 0.0, 2.0]),
    (R_1000, 1, 1e-4, [-0.00059976, -1.9994002, 0.00019992, 1.9998]),
    (R_1000, 0, 1e-4, [-0.0008, -2.308601, 0.000267, 2.309134]),
    (R_NB, 1, 1e-4, [-3.278311, 0.936151, -0.467939, 2.810099]),
]


@pytest.mark.parametrize("r, ddof, eps, expected", GRAD_ROWS)
def test_gradient_literal(r, ddof, eps, expected):
    np.testing.assert_allclose(_weighted_grad(r, ddof=ddof, eps=eps), expected, atol=ATOL)


def test_gradient_guard_is_per_group():
    # an all-equal group next to a non-degenerate one: the guard zeroes only its own group's gradient
    f = lambda x: (jnp.array(W) * A.group_zscore(x, ddof=1, eps=1e-4)).sum()  # noqa: E731
    g = jax.grad(f)(jnp.array([[1.0] * 4, R_1000]))
    np.testing.assert_allclose(g, [[0.0] * 4, [-0.00059976, -1.9994002, 0.00019992, 1.9998]], atol=ATOL)


def test_rloo_identity():
    # RLOO = G/(G-1) * Dr. GRPO (T1: 0.666667 = 4/3 * 0.5).
    for r in (R_1001, R_1000, R_NB):
        np.testing.assert_allclose(
            A.rloo(jnp.array(r)), 4.0 / 3.0 * np.asarray(A.group_mean_only(jnp.array(r))), atol=ATOL
        )


def test_t1b_baseline_cancels_under_zscore_but_not_scale_only():
    r = jnp.array(R_1001)
    b = 0.25  # mean of the pool [0.2, 0.3, 0.25, 0.25]
    np.testing.assert_allclose(
        A.group_zscore(r - b, ddof=1, eps=0.0), [0.866025, -0.866025, -0.866025, 0.866025], atol=ATOL
    )
    out = A.scaled_baseline(r, jnp.array(b), ddof=1, eps=0.0)
    np.testing.assert_allclose(out, [1.299038, -0.433013, -0.433013, 1.299038], atol=ATOL)
    out = A.compute_advantages(r, method="scaled_baseline", ddof=1, eps=0.0, baseline=jnp.array(b))
    np.testing.assert_allclose(out, [1.299038, -0.433013, -0.433013, 1.299038], atol=ATOL)


def test_scaled_baseline_zero_variance_uses_std_floor():
    # all-fail group, pool baseline 0.25 -> -0.25 / std_floor (1.0): negative, finite.
    out = A.scaled_baseline(jnp.zeros(4), jnp.array(0.25), eps=0.0)
    np.testing.assert_allclose(out, [-0.25] * 4, atol=ATOL)
    out = A.scaled_baseline(jnp.ones(4), jnp.array(0.25), eps=0.0, std_floor=0.5)
    np.testing.assert_allclose(out, [1.5] * 4, atol=ATOL)


def test_scaled_baseline_batched():
    r = jnp.array([R_1001, [0.0, 0.0, 0.0, 0.0]])
    b = jnp.array([0.25, 0.5])
    out = A.scaled_baseline(r, b, ddof=1, eps=0.0)
    np.testing.assert_allclose(out, [[1.299038, -0.433013, -0.433013, 1.299038], [-0.5] * 4], atol=ATOL)


def test_masked_members():
    # An extra masked member (reward 5) must not change the statistics and gets 0.
    r = jnp.array([1.0, 0.0, 0.0, 1.0, 5.0])
    m = jnp.array([1, 1, 1, 1, 0], bool)
    np.testing.assert_allclose(
        A.group_zscore(r, ddof=1, eps=0.0, mask=m), [0.866025, -0.866025, -0.866025, 0.866025, 0.0], atol=ATOL
    )
    np.testing.assert_allclose(A.group_mean_only(r, mask=m), [0.5, -0.5, -0.5, 0.5, 0.0], atol=ATOL)
    np.testing.assert_allclose(
        A.rloo(r, mask=m.astype(jnp.float32)), [0.666667, -0.666667, -0.666667, 0.666667, 0.0], atol=ATOL
    )
    # masked member in the middle
    r = jnp.array([1.0, 7.0, 0.0, 0.0, 0.0])
    m = jnp.array([1, 0, 1, 1, 1])
    np.testing.assert_allclose(
        A.group_zscore(r, ddof=1, eps=0.0, mask=m), [1.5, 0, -0.5, -0.5, -0.5], atol=ATOL
    )
    # fully masked group and a single valid member: 0, no NaN
    np.testing.assert_array_equal(A.group_zscore(r, mask=jnp.zeros(5)), np.zeros(5))
    np.testing.assert_array_equal(A.rloo(r, mask=jnp.array([1, 0, 0, 0, 0])), np.zeros(5))
    np.testing.assert_array_equal(A.group_zscore(r, eps=0.0, mask=jnp.array([1, 0, 0, 0, 0])), np.zeros(5))


def test_batched_input_matches_rows():
    r = jnp.array([R_1001, R_1000, R_NB, [1.0, 1.0, 1.0, 1.0]])  # [B=4, G=4]
    out = A.group_zscore(r, ddof=1, eps=0.0)
    expected = [
        [0.866025, -0.866025, -0.866025, 0.866025],
        [1.5, -0.5, -0.5, -0.5],
        [0.146385, 1.317465, -1.024695, -0.439155],
        [0.0, 0.0, 0.0, 0.0],
    ]
    np.testing.assert_allclose(out, expected, atol=ATOL)
    out3 = A.group_mean_only(jnp.stack([r, r]))  # [2, B, G]
    assert out3.shape == (2, 4, 4)
    np.testing.assert_allclose(out3[1, 1], [0.75, -0.25, -0.25, -0.25], atol=ATOL)


def test_batch_std_scaled():
    r = np.array([R_1001, R_1000], np.float64)
    # TRL scale_rewards="batch": group mean, std over all 8 rewards (ddof=1): mean 0.375, var 1.875/7.
    batch_std = np.sqrt(1.875 / 7.0)
    expected = (r - r.mean(-1, keepdims=True)) / (batch_std + 1e-4)
    np.testing.assert_allclose(A.batch_std_scaled(jnp.array(r)), expected, atol=ATOL)
    np.testing.assert_allclose(A.compute_advantages(jnp.array(r), method="batch_std"), expected, atol=ATOL)


def test_process_advantages_hand_example():
    # B=1, G=2, S=2, T=4. seq0 steps: rewards (1, 0) ending at tokens 1 and 3; seq1: one step, reward 0,
    # ending at token 2. Valid step rewards R = [1, 0, 0]: mean 1/3, std_ddof1 = sqrt(1/3);
    # normalised: 1 -> 1.154701, 0 -> -0.577350.
    step_rewards = jnp.array([[[1.0, 0.0], [0.0, 9.0]]])
    step_end = jnp.array([[[1, 3], [2, 0]]])
    step_mask = jnp.array([[[1, 1], [1, 0]]])
    out = A.process_advantages(step_rewards, step_end, step_mask, 4, ddof=1, eps=0.0)
    assert out.shape == (1, 2, 4)
    expected = [[[0.577350, 0.577350, -0.577350, -0.577350], [-0.577350, -0.577350, -0.577350, 0.0]]]
    np.testing.assert_allclose(out, expected, atol=ATOL)
    jitted = jax.jit(A.process_advantages, static_argnums=3, static_argnames=("ddof", "eps"))
    np.testing.assert_allclose(
        jitted(step_rewards, step_end, step_mask, 4, ddof=1, eps=0.0), expected, atol=ATOL
    )
    # all-equal step rewards -> 0
    out = A.process_advantages(jnp.ones((1, 2, 2)), step_end, jnp.ones((1, 2, 2)), 4, eps=0.0)
    np.testing.assert_array_equal(out, np.zeros((1, 2, 4)))


def test_compute_advantages_dispatch_and_errors():
    r = jnp.array(R_1000)
    np.testing.assert_allclose(
        A.compute_advantages(r, method="grpo"), [1.4997, -0.4999, -0.4999, -0.4999], atol=ATOL
    )
    np.testing.assert_allclose(
        A.compute_advantages(r, method="dr_grpo"), [0.75, -0.25, -0.25, -0.25], atol=ATOL
    )
    np.testing.assert_allclose(
        A.compute_advantages(r, method="rloo"), [1.0, -0.333333, -0.333333, -0.333333], atol=ATOL
    )
    with pytest.raises(ValueError, match="grpo.*dr_grpo.*rloo.*batch_std.*scaled_baseline"):
        A.compute_advantages(r, method="ppo")
    with pytest.raises(ValueError, match="baseline"):
        A.compute_advantages(r, method="scaled_baseline")


def test_whiten():
    x = jnp.array([1.0, 2.0, 3.0, 100.0])
    m = jnp.array([1, 1, 1, 0])
    # masked mean 2, unbiased masked var 1
    np.testing.assert_allclose(A.whiten(x, m), [-1.0, 0.0, 1.0, 98.0], atol=ATOL)
    np.testing.assert_allclose(A.whiten(x, m, shift_mean=False), [1.0, 2.0, 3.0, 100.0], atol=ATOL)
    np.testing.assert_allclose(jax.jit(A.whiten)(x, m), [-1.0, 0.0, 1.0, 98.0], atol=ATOL)


def _np_advantages(method, r, m, b, ddof=1, eps=1e-4, std_floor=1.0):
    """Float64 NumPy oracle of compute_advantages for one [B, G] batch, written from the docstrings."""
    r, m = np.asarray(r, np.float64), np.asarray(m, bool)
    out = np.zeros_like(r)

    def stats(x):  # mean, std(ddof), all-equal flag of the valid values x
        if len(x) == 0:
            return 0.0, 0.0, True
        var = ((x - x.mean()) ** 2).sum() / (len(x) - ddof) if len(x) > ddof else 0.0
        return x.mean(), np.sqrt(var), bool(x.max() == x.min() or var == 0)

    _, bstd, bzero = stats(r[m])
    for i in range(r.shape[0]):
        x = r[i][m[i]]
        mean, std, zero = stats(x)
        if method == "grpo":
            row = 0.0 if zero else (r[i] - mean) / (std + eps)
        elif method == "dr_grpo":
            row = 0.0 if zero else r[i] - mean
        elif method == "rloo":
            row = 0.0 if zero or len(x) <= 1 else r[i] - (x.sum() - r[i]) / (len(x) - 1)
        elif method == "batch_std":
            row = 0.0 if zero or bzero else (r[i] - mean) / (bstd + eps)
        else:  # scaled_baseline
            row = (r[i] - b[i]) / (std_floor if zero else std + eps)
        out[i] = np.where(m[i], row, 0.0)
    return out


@pytest.mark.parametrize("method", A.ADV_METHODS)
def test_jit_and_vmap_match(method):
    rng = np.random.default_rng(0)
    r = jnp.array(rng.integers(0, 2, size=(3, 4, 4)).astype(np.float32))  # [N, B, G]
    mask = jnp.array(rng.random((3, 4, 4)) > 0.2)
    base = jnp.array(rng.random((3, 4)).astype(np.float32))

    def f(rr, mm, bb):
        return A.compute_advantages(rr, method=method, mask=mm, baseline=bb)

    fj = jax.jit(f)
    # jit == no-jit on one [B, G] batch
    np.testing.assert_allclose(fj(r[0], mask[0], base[0]), f(r[0], mask[0], base[0]), atol=ATOL)
    # vmap over N == loop over N (batch_std couples the groups of one [B, G] batch; vmap keeps the N apart)
    vm = jax.jit(jax.vmap(f))(r, mask, base)
    loop = np.stack([np.asarray(fj(r[i], mask[i], base[i])) for i in range(r.shape[0])])
    np.testing.assert_allclose(vm, loop, atol=ATOL)
    # and both equal the NumPy oracle (all-equal, partly masked and ordinary groups all occur in this draw)
    oracle = np.stack([_np_advantages(method, r[i], mask[i], base[i]) for i in range(r.shape[0])])
    np.testing.assert_allclose(vm, oracle, atol=ATOL)
    assert np.count_nonzero(oracle) >= 10  # the draw is not degenerate: most groups get nonzero advantages
