"""The loss math (grpo_jax.core.kl / surrogates / aggregation / value; grpo_jax.algorithms.policy_loss)
against docs/GRPO_MATH.md §4 T2–T8 (literal expected values)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algorithms import policy_loss as P
from grpo_jax.algorithms.policy_loss import PolicyInputs
from grpo_jax.config import PolicyLossConfig
from grpo_jax.core import advantages as ADV
from grpo_jax.core import aggregation as AGG
from grpo_jax.core import kl as KL
from grpo_jax.core import surrogates as S
from grpo_jax.core import value as V

ATOL = 1e-5

# ------------------------------------------------------------------------------------------------------------
# T2 — ratio and clip
# ------------------------------------------------------------------------------------------------------------

# logp_new, logp_old, A, eps_low, eps_high, rho, objective, clipped (low, high)
T2_ROWS = [
    (-0.8, -1.0, 1.0, 0.2, 0.2, 1.221403, 1.200000, (0.0, 1.0)),
    (-0.8, -1.0, -1.0, 0.2, 0.2, 1.221403, -1.221403, (0.0, 0.0)),
    (-0.8, -1.0, 1.0, 0.2, 0.28, 1.221403, 1.221403, (0.0, 0.0)),
    (-1.3, -1.0, 1.0, 0.2, 0.2, 0.740818, 0.740818, (0.0, 0.0)),
    (-1.3, -1.0, -1.0, 0.2, 0.2, 0.740818, -0.800000, (1.0, 0.0)),
    (-1.0, -1.0, 0.866, 0.2, 0.2, 1.000000, 0.866000, (0.0, 0.0)),
]


def test_t2_rows_vectorised_and_jit():
    lp, lo, a, el, eh, rho, obj, clip = (np.array(c) for c in zip(*T2_ROWS, strict=True))
    clip = np.array([list(c) for c in clip])
    for fn in (S.clipped_surrogate, jax.jit(S.clipped_surrogate)):
        out, aux = fn(
            jnp.array(lp), jnp.array(lo), jnp.array(a), eps_low=jnp.array(el), eps_high=jnp.array(eh)
        )
        np.testing.assert_allclose(out, obj, atol=ATOL)
        np.testing.assert_allclose(aux.ratio, rho, atol=ATOL)
        np.testing.assert_allclose(aux.is_low_clipped, clip[:, 0], atol=0)
        np.testing.assert_allclose(aux.is_high_clipped, clip[:, 1], atol=0)
    # clipped exactly when the policy gradient is zero (rule under T2)
    grad = jax.grad(
        lambda x: S.clipped_surrogate(
            x, jnp.array(lo), jnp.array(a), eps_low=jnp.array(el), eps_high=jnp.array(eh)
        )[0].sum()
    )(jnp.array(lp))
    is_clipped = clip.sum(1) > 0
    np.testing.assert_array_equal(np.asarray(grad) == 0.0, is_clipped)
    # unclipped gradient = rho * A
    np.testing.assert_allclose(np.asarray(grad)[~is_clipped], (rho * a)[~is_clipped], atol=ATOL)


def test_dual_clip_and_delta():
    lp = jnp.log(jnp.array([5.0, 5.0, 0.5]))  # rho = 5, 5, 0.5 (logp_old = 0)
    lo = jnp.zeros(3)
    a = jnp.array([-1.0, 1.0, 1.0])
    out, _ = S.clipped_surrogate(lp, lo, a, eps_low=0.2, eps_high=0.2)
    np.testing.assert_allclose(out, [-5.0, 1.2, 0.5], atol=ATOL)
    # dual clip c=3: for A<0 the objective is max(min(...), c*A) = max(-5, -3) = -3
    out, _ = S.clipped_surrogate(lp, lo, a, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    np.testing.assert_allclose(out, [-3.0, 1.2, 0.5], atol=ATOL)
    # delta 4: unclipped branch uses min(rho, 4): min(-4, -1.2) = -4; clip metrics see the clamped ratio.
    out, aux = S.clipped_surrogate(lp, lo, a, eps_low=0.2, eps_high=0.2, delta=4.0)
    np.testing.assert_allclose(out, [-4.0, 1.2, 0.5], atol=ATOL)
    np.testing.assert_allclose(aux.is_high_clipped, [0.0, 1.0, 0.0])
    np.testing.assert_allclose(aux.ratio, [5.0, 5.0, 0.5], atol=ATOL)
    # delta = 1.1 < 1 + eps_high: the clamped ratio 1.1 is NOT counted as high-clipped (TRL metric order)
    _, aux = S.clipped_surrogate(lp, lo, a, eps_low=0.2, eps_high=0.2, delta=1.1)
    np.testing.assert_allclose(aux.is_high_clipped, [0.0, 0.0, 0.0])


def test_surrogate_stop_gradients():
    lp, lo, a = jnp.array([-0.8]), jnp.array([-1.0]), jnp.array([-1.0])
    g_old = jax.grad(lambda x: S.clipped_surrogate(lp, x, a, eps_low=0.2, eps_high=0.2)[0].sum())(lo)
    g_adv = jax.grad(lambda x: S.clipped_surrogate(lp, lo, x, eps_low=0.2, eps_high=0.2)[0].sum())(a)
    np.testing.assert_array_equal(g_old, [0.0])
    np.testing.assert_array_equal(g_adv, [0.0])


# ------------------------------------------------------------------------------------------------------------
# T3 — KL estimators
# ------------------------------------------------------------------------------------------------------------

T3 = np.array(
    [
        # logp_theta, logp_ref, k1, k2, k3, dk3/dlogp
        [-1.0, -1.5, 0.500000, 0.125000, 0.106531, 0.393469],
        [-2.0, -1.0, -1.000000, 0.500000, 0.718282, -1.718282],
        [-1.0, -1.0, 0.0, 0.0, 0.0, 0.0],
        [-0.1, -3.0, 2.900000, 4.205000, 1.955023, 0.944977],
    ]
)


def test_t3_kl_estimators_and_k3_gradient():
    lp, lr = jnp.array(T3[:, 0]), jnp.array(T3[:, 1])
    for kind, col in (("k1", 2), ("k2", 3), ("k3", 4)):
        np.testing.assert_allclose(KL.kl_penalty(lp, lr, kind=kind), T3[:, col], atol=ATOL)
        jitted = jax.jit(functools.partial(KL.kl_penalty, kind=kind))
        np.testing.assert_allclose(jitted(lp, lr), T3[:, col], atol=ATOL)
    g = jax.grad(lambda x: KL.kl_penalty(x, lr, kind="k3").sum())(lp)
    np.testing.assert_allclose(g, T3[:, 5], atol=ATOL)
    g_ref = jax.grad(lambda x: KL.kl_penalty(lp, x, kind="k3").sum())(lr)
    np.testing.assert_array_equal(g_ref, np.zeros(4))  # the anchor is stop-gradient'ed
    assert np.all(np.asarray(KL.kl_penalty(lp, lr, kind="k3")) >= 0)


def test_k3_is_finite_for_extreme_inputs():
    lp = jnp.array([-200.0, 0.0, -1e4])
    lr = jnp.array([0.0, -200.0, 0.0])
    v = KL.kl_penalty(lp, lr, kind="k3")
    g = jax.grad(lambda x: KL.kl_penalty(x, lr, kind="k3").sum())(lp)
    assert np.all(np.isfinite(v)) and np.all(np.isfinite(g))
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        KL.kl_penalty(lp, lr, kind="k4")


# ------------------------------------------------------------------------------------------------------------
# T4 — aggregation and length bias
# ------------------------------------------------------------------------------------------------------------

T4_LOSS = jnp.array(
    [[-1.0, -1.0, 0.0, 0.0, 9.0], [1.0, 1.0, 1.0, 1.0, 9.0]]
)  # padded to width 5 (garbage at pads)
T4_MASK = jnp.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], jnp.float32)
T4_ROWS = [
    ("seq_mean_token_mean", 0.0, [[0.25, 0.25, 0, 0, 0], [0.125, 0.125, 0.125, 0.125, 0]]),
    ("token_mean", 0.333333, [[1 / 6, 1 / 6, 0, 0, 0], [1 / 6, 1 / 6, 1 / 6, 1 / 6, 0]]),
    ("constant", 0.25, [[1 / 8, 1 / 8, 0, 0, 0], [1 / 8, 1 / 8, 1 / 8, 1 / 8, 0]]),
]


@pytest.mark.parametrize("mode, loss, weights", T4_ROWS)
def test_t4_aggregation(mode, loss, weights):
    f = functools.partial(AGG.aggregate, mode=mode, max_len=4)
    np.testing.assert_allclose(f(T4_LOSS, T4_MASK), loss, atol=ATOL)
    np.testing.assert_allclose(jax.jit(f)(T4_LOSS, T4_MASK), loss, atol=ATOL)
    np.testing.assert_allclose(jax.grad(f)(T4_LOSS, T4_MASK), weights, atol=ATOL)


def test_aggregate_seq_mean_and_edge_cases():
    # seq_mean: [...]-shaped per-sequence values, or the value broadcast over T
    per_seq = jnp.array([-1.0, 1.0, 3.0])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # third sequence fully masked
    np.testing.assert_allclose(AGG.aggregate(per_seq, mask, mode="seq_mean"), 1.0, atol=ATOL)
    np.testing.assert_allclose(
        AGG.aggregate(jnp.broadcast_to(per_seq[:, None], (3, 3)), mask, mode="seq_mean"), 0.0, atol=ATOL
    )
    # no valid tokens at all: finite zero, finite gradient
    zero_mask = jnp.zeros((2, 3))
    for mode in AGG.AGGREGATIONS:
        v = AGG.aggregate(jnp.ones((2, 3)), zero_mask, mode=mode, max_len=3)
        g = jax.grad(lambda x, mode=mode: AGG.aggregate(x, zero_mask, mode=mode, max_len=3))(jnp.ones((2, 3)))
        assert float(v) == 0.0 and np.all(np.isfinite(g))
    with pytest.raises(ValueError, match="max_len"):
        AGG.aggregate(jnp.ones((2, 3)), zero_mask, mode="constant")
    with pytest.raises(ValueError, match="seq_mean_token_mean.*token_mean.*constant.*seq_mean"):
        AGG.aggregate(jnp.ones((2, 3)), zero_mask, mode="mean")
    # token_count override (global token count of an accumulated batch)
    np.testing.assert_allclose(
        AGG.aggregate(T4_LOSS, T4_MASK, mode="token_mean", token_count=12.0), 2.0 / 12.0, atol=ATOL
    )


# ------------------------------------------------------------------------------------------------------------
# T5 — full worked example
# ------------------------------------------------------------------------------------------------------------

# [G=2, T=5]: seq0 has 2 tokens, seq1 has 3; the padded width (5) differs from L_max (4) on purpose, and the
# padding holds garbage that must not leak through.
MASK = jnp.array([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], jnp.float32)
LP_OLD = jnp.array([[-0.5, -1.0, 0.0, 3.0, -50.0], [-0.7, -1.2, -0.3, 3.0, -50.0]])
LP_NEW = jnp.array([[-0.3, -1.1, 5.0, -40.0, 0.0], [-0.9, -1.0, -0.3, -40.0, 0.0]])
LP_REF = jnp.array([[-0.6, -0.9, -30.0, 0.0, 1.0], [-0.7, -1.5, -0.2, 0.0, 1.0]])
RATIOS = np.array([[1.221403, 0.904837], [0.818731, 1.221403, 1.0]], dtype=object)
K3 = [[0.040818, 0.021403], [0.021403, 0.106531, 0.005171]]
A_DDOF1 = float(np.sqrt(0.5))  # (1 - 0.5)/std_ddof1([1, 0]) = 0.707107
A_DDOF0 = 1.0
A_DR = 0.5
A_TRL = 0.5 / (np.sqrt(0.5) + 1e-4)  # 0.707007

# (A, eps_high, beta, per-token loss, grpo, token-mean, dr_grpo); eps_low = 0.2 in every row.
T5_ROWS = [
    (
        A_DDOF1,
        0.2,
        0.0,
        [[-0.848528, -0.639817], [0.57893, 0.863662, 0.707107]],
        -0.013803,
        0.132271,
        0.082669,
    ),
    (
        A_DDOF1,
        0.2,
        0.04,
        [[-0.846895, -0.638961], [0.579786, 0.867923, 0.707314]],
        -0.012293,
        0.133833,
        0.083646,
    ),
    (
        A_DDOF1,
        0.28,
        0.0,
        [[-0.863662, -0.639817], [0.57893, 0.863662, 0.707107]],
        -0.017587,
        0.129244,
        0.080778,
    ),
    (
        A_DDOF1,
        0.28,
        0.04,
        [[-0.862029, -0.638961], [0.579786, 0.867923, 0.707314]],
        -0.016077,
        0.130807,
        0.081754,
    ),
    (
        A_DDOF0,
        0.2,
        0.04,
        [[-1.198367, -0.903981], [0.819587, 1.225664, 1.000207]],
        -0.018011,
        0.188622,
        0.117889,
    ),
    (A_DR, 0.2, 0.0, [[-0.6, -0.452419], [0.409365, 0.610701, 0.5]], -0.009760, 0.093530, 0.058456),
    (
        A_DR,
        0.28,
        0.04,
        [[-0.609069, -0.451563], [0.410221, 0.614963, 0.500207]],
        -0.010926,
        0.092952,
        0.058095,
    ),
    # TRL eps (ddof=1, eps=1e-4): A = ±0.707007
    (A_TRL, 0.2, 0.0, [[-0.848408, -0.639726], [0.578848, 0.86354, 0.707007]], -0.013801, 0.132252, 0.082658),
    (
        A_TRL,
        0.2,
        0.04,
        [[-0.846775, -0.63887], [0.579704, 0.867801, 0.707214]],
        -0.012292,
        0.133815,
        0.083634,
    ),
    (
        A_TRL,
        0.28,
        0.04,
        [[-0.861907, -0.63887], [0.579704, 0.867801, 0.707214]],
        -0.016074,
        0.130788,
        0.081743,
    ),
]


def _pad(rows, width=5):
    return np.array([list(r) + [0.0] * (width - len(r)) for r in rows])


def _cfg(eps_high, aggregation="seq_mean_token_mean", **kw):
    return PolicyLossConfig(eps_low=0.2, eps_high=eps_high, aggregation=aggregation, max_len=4, **kw)


# Jitted once per (cfg, shapes): far cheaper on CPU than eager op-by-op dispatch. Eager == jit is checked
# separately (test_t5_eager_matches_jit).
grpo_loss_j = jax.jit(P.policy_loss, static_argnames=("cfg",))
grpo_per_token_loss_j = jax.jit(P.policy_per_token_loss, static_argnames=("cfg",))


@pytest.mark.parametrize("row", range(len(T5_ROWS)))
def test_t5_per_token_loss_and_aggregations(row):
    a, eps_high, beta, per_tok, grpo, tok_mean, dr = T5_ROWS[row]
    adv = jnp.array([a, -a])  # [G] per-sequence advantages
    beta = jnp.float32(beta)
    pt, _ = grpo_per_token_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK), cfg=_cfg(eps_high), kl_coef=beta, entropy_coef=0.0
    )
    np.testing.assert_allclose(np.asarray(pt) * np.asarray(MASK), _pad(per_tok), atol=ATOL)
    for aggregation, expected in (("seq_mean_token_mean", grpo), ("token_mean", tok_mean), ("constant", dr)):
        cfg = _cfg(eps_high, aggregation)
        loss, aux = grpo_loss_j(
            PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK), cfg=cfg, kl_coef=beta, entropy_coef=0.0
        )
        np.testing.assert_allclose(loss, expected, atol=ATOL)
        np.testing.assert_allclose(aux.loss, expected, atol=ATOL)


def test_t5_eager_matches_jit():
    a, eps_high, beta, per_tok, _, tok_mean, _ = T5_ROWS[3]
    adv = jnp.array([a, -a])
    cfg = _cfg(eps_high, "token_mean")
    eager, aux_e = P.policy_loss(
        P.PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK), cfg=cfg, kl_coef=beta, entropy_coef=0.0
    )
    jitted, aux_j = grpo_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK), cfg=cfg, kl_coef=beta, entropy_coef=0.0
    )
    np.testing.assert_allclose(eager, tok_mean, atol=ATOL)
    np.testing.assert_allclose(jitted, tok_mean, atol=ATOL)
    for e, j in zip(aux_e, aux_j, strict=True):
        np.testing.assert_allclose(e, j, atol=ATOL)
    pt, _ = P.policy_per_token_loss(
        P.PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK), cfg=cfg, kl_coef=beta, entropy_coef=0.0
    )
    np.testing.assert_allclose(np.asarray(pt) * np.asarray(MASK), _pad(per_tok), atol=ATOL)


T5_GRADS = {
    "seq_mean_token_mean": [[-0.213324, -0.162168], [0.095012, 0.146567, 0.117150]],
    "token_mean": [[-0.170659, -0.129735], [0.114015, 0.175880, 0.140580]],
    "constant": [[-0.106662, -0.081084], [0.071259, 0.109925, 0.087862]],
}


@pytest.mark.parametrize("aggregation", list(T5_GRADS))
def test_t5_gradients(aggregation):
    # A ddof=1, eps 0.2/0.28, beta 0.04; gradient wrt logp_new with sg on logp_old / logp_ref / adv.
    cfg = _cfg(0.28, aggregation)
    adv = jnp.array([A_DDOF1, -A_DDOF1])

    def f(lp, lo, lr, a):
        return P.policy_loss(P.PolicyInputs(lp, lo, lr, a, MASK), cfg=cfg, kl_coef=0.04, entropy_coef=0.0)[0]

    g_lp, g_lo, g_lr, g_a = jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))(LP_NEW, LP_OLD, LP_REF, adv)
    np.testing.assert_allclose(g_lp, _pad(T5_GRADS[aggregation]), atol=ATOL)
    # no gradient leaks into the anchors or the advantages
    for g in (g_lo, g_lr, g_a):
        np.testing.assert_array_equal(g, np.zeros(g.shape))
    if aggregation == "seq_mean_token_mean":
        np.testing.assert_allclose(
            jax.grad(f)(LP_NEW, LP_OLD, LP_REF, adv), _pad(T5_GRADS[aggregation]), atol=ATOL
        )


def test_t5_aux_diagnostics():
    adv = jnp.array([A_DDOF1, -A_DDOF1])
    _, aux = grpo_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK), cfg=_cfg(0.2), kl_coef=0.04, entropy_coef=0.0
    )
    # seq0 token0 (A>0, rho 1.2214) is high-clipped; seq1 token0 (A<0, rho 0.8187 > 0.8) is not low-clipped.
    np.testing.assert_allclose(aux.clip_high_frac, 1 / 5, atol=ATOL)
    np.testing.assert_allclose(aux.clip_low_frac, 0.0, atol=ATOL)
    np.testing.assert_allclose(aux.clip_region_frac, 1 / 5, atol=ATOL)
    np.testing.assert_allclose(aux.ratio_max, 1.221403, atol=ATOL)
    np.testing.assert_allclose(aux.ratio_min, 0.818731, atol=ATOL)
    np.testing.assert_allclose(
        aux.ratio_mean, (1.221403 + 0.904837 + 0.818731 + 1.221403 + 1.0) / 5, atol=ATOL
    )
    np.testing.assert_allclose(aux.kl, (0.040818 + 0.021403 + 0.021403 + 0.106531 + 0.005171) / 5, atol=ATOL)
    np.testing.assert_allclose(aux.adv_mean, -A_DDOF1 / 5, atol=ATOL)
    np.testing.assert_allclose(aux.adv_abs_mean, A_DDOF1, atol=ATOL)
    np.testing.assert_allclose(aux.pg_loss, -0.013803, atol=ATOL)  # β=0 row of T5 (same ε)
    np.testing.assert_allclose(aux.entropy, 0.0, atol=ATOL)
    for v in aux:
        assert np.shape(v) == ()


def test_per_token_advantage_equals_broadcast_and_ref_none_skips_kl():
    cfg = _cfg(0.2)
    adv = jnp.array([A_DDOF1, -A_DDOF1])
    adv_tok = jnp.broadcast_to(adv[:, None], MASK.shape)
    l1, _ = grpo_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK), cfg=cfg, kl_coef=0.04, entropy_coef=0.0
    )
    l2, _ = grpo_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv_tok, MASK), cfg=cfg, kl_coef=0.04, entropy_coef=0.0
    )
    l2b, _ = grpo_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv[:, None], MASK), cfg=cfg, kl_coef=0.04, entropy_coef=0.0
    )
    np.testing.assert_allclose(l2b, -0.012293, atol=ATOL)
    np.testing.assert_allclose(l1, -0.012293, atol=ATOL)
    np.testing.assert_allclose(l2, -0.012293, atol=ATOL)
    l3, aux = grpo_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, None, adv, MASK), cfg=cfg, kl_coef=0.04, entropy_coef=0.0
    )
    np.testing.assert_allclose(l3, -0.013803, atol=ATOL)  # = the β=0 row
    np.testing.assert_allclose(aux.kl, 0.0, atol=ATOL)


def test_entropy_bonus():
    adv = jnp.array([A_DDOF1, -A_DDOF1])
    ent = jnp.full(MASK.shape, 2.0)
    loss, aux = grpo_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK, entropy=ent),
        cfg=_cfg(0.2),
        kl_coef=0.0,
        entropy_coef=0.1,
    )
    np.testing.assert_allclose(loss, -0.013803 - 0.2, atol=ATOL)
    np.testing.assert_allclose(aux.entropy, 2.0, atol=ATOL)


def test_kl_bias_correction_tis_and_old_anchor():
    adv = jnp.array([A_DDOF1, -A_DDOF1])
    ratios = _pad(RATIOS)
    k3 = _pad(K3)
    beta0 = _pad(T5_ROWS[0][3])  # β=0, ε 0.2/0.2 per-token loss = −surrogate
    # TRL use_bias_correction_kl: KL = k3 * rho
    pt, terms = grpo_per_token_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK),
        cfg=_cfg(0.2, kl_bias_correction=True),
        kl_coef=0.04,
        entropy_coef=0.0,
    )
    np.testing.assert_allclose(np.asarray(terms.kl) * MASK, k3 * ratios, atol=ATOL)
    np.testing.assert_allclose(np.asarray(pt) * MASK, beta0 + 0.04 * k3 * ratios, atol=ATOL)
    # TIS: behaviour logp = old − log 2 -> weight min(2, 1.5) = 1.5 on the surrogate only, not on the KL.
    lp_b = LP_OLD - jnp.log(2.0)
    pt, terms = grpo_per_token_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK, logp_behaviour=lp_b),
        cfg=_cfg(0.2, tis_cap=1.5),
        kl_coef=0.04,
        entropy_coef=0.0,
    )
    np.testing.assert_allclose(np.asarray(pt) * MASK, 1.5 * beta0 + 0.04 * k3, atol=ATOL)
    with pytest.raises(ValueError, match="logp_behaviour"):
        grpo_loss_j(
            PolicyInputs(LP_NEW, LP_OLD, LP_REF, adv, MASK),
            cfg=_cfg(0.2, tis_cap=1.5),
            kl_coef=0.0,
            entropy_coef=0.0,
        )
    # kl_anchor="old" (the seed's formula, k1 = logp − logp_old): [[0.2, −0.1], [−0.2, 0.2, 0]] -> mean 0.02
    cfg = _cfg(0.2, kl_anchor="old", kl_estimator="k1")
    _, aux = grpo_loss_j(
        PolicyInputs(LP_NEW, LP_OLD, None, adv, MASK), cfg=cfg, kl_coef=0.01, entropy_coef=0.0
    )
    np.testing.assert_allclose(aux.kl, 0.02, atol=ATOL)


def test_kl_coef_is_traced_no_retrace():
    traces = []

    @functools.partial(jax.jit, static_argnames=("cfg",))
    def f(logp, kl_coef, entropy_coef, *, cfg):
        traces.append(1)
        return P.policy_loss(
            P.PolicyInputs(logp, LP_OLD, LP_REF, jnp.array([A_DDOF1, -A_DDOF1]), MASK),
            cfg=cfg,
            kl_coef=kl_coef,
            entropy_coef=entropy_coef,
        )[0]

    cfg = _cfg(0.2)
    np.testing.assert_allclose(f(LP_NEW, jnp.float32(0.0), jnp.float32(0.0), cfg=cfg), -0.013803, atol=ATOL)
    np.testing.assert_allclose(f(LP_NEW, jnp.float32(0.04), jnp.float32(0.0), cfg=cfg), -0.012293, atol=ATOL)
    assert len(traces) == 1
    hash(cfg)  # hashable, usable as a static argument


def test_zero_valid_tokens_no_nan():
    adv = jnp.array([1.0, -1.0])
    ent = jnp.ones(MASK.shape)

    @jax.jit
    def all_modes(lp, m):  # every aggregation and importance level in one compile
        out = []
        for aggregation in AGG.AGGREGATIONS:
            for level in S.IMPORTANCE_LEVELS:
                cfg = _cfg(0.2, aggregation, importance_level=level)
                f = lambda x, cfg=cfg: P.policy_loss(
                    P.PolicyInputs(x, LP_OLD, LP_REF, adv, m, entropy=ent),
                    cfg=cfg,
                    kl_coef=0.04,
                    entropy_coef=0.01,
                )
                out.append(jax.value_and_grad(f, has_aux=True)(lp))
        return out

    for m in (MASK.at[1].set(0.0), jnp.zeros_like(MASK)):
        for (loss, aux), g in all_modes(LP_NEW, m):
            assert np.isfinite(float(loss))
            assert all(np.isfinite(float(v)) for v in aux)
            assert np.all(np.isfinite(g))


def test_garbage_padding_is_harmless():
    # −inf / NaN in padded positions (e.g. a sampler's padding) must reach neither the loss nor the gradient.
    pad = MASK == 0
    lp = jnp.where(pad, -jnp.inf, LP_NEW)
    lo = jnp.where(pad, jnp.nan, LP_OLD)
    lr = jnp.where(pad, jnp.inf, LP_REF)
    ent = jnp.where(pad, jnp.nan, 1.0)
    cfg = _cfg(0.28, "token_mean", tis_cap=2.0, kl_bias_correction=True)

    @jax.jit
    def vg(x):
        f = lambda y: P.policy_loss(
            P.PolicyInputs(y, lo, lr, jnp.array([A_DDOF1, -A_DDOF1]), MASK, entropy=ent, logp_behaviour=lo),
            cfg=cfg,
            kl_coef=0.04,
            entropy_coef=0.0,
        )
        return jax.value_and_grad(f, has_aux=True)(x)

    (loss, aux), g = vg(lp)
    assert np.isfinite(float(loss)) and all(np.isfinite(float(v)) for v in aux)
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[np.asarray(pad)] == 0.0)


def test_vmap_matches_loop():
    rng = np.random.default_rng(1)
    N, G, T = 3, 4, 5
    lp = jnp.array(rng.normal(-1.0, 0.3, (N, G, T)), jnp.float32)
    lo = lp + jnp.array(rng.normal(0.0, 0.2, (N, G, T)), jnp.float32)
    lr = lp + jnp.array(rng.normal(0.0, 0.2, (N, G, T)), jnp.float32)
    adv = jnp.array(rng.normal(size=(N, G)), jnp.float32)
    mask = jnp.array(rng.random((N, G, T)) > 0.3, jnp.float32)
    cfg = _cfg(0.28, "token_mean", dual_clip=3.0)

    def f(a, b, c, d, e):
        return P.policy_loss(P.PolicyInputs(a, b, c, d, e), cfg=cfg, kl_coef=0.04, entropy_coef=0.0)[0]

    vm = jax.jit(jax.vmap(f))(lp, lo, lr, adv, mask)
    fj = jax.jit(f)
    loop = [float(fj(lp[i], lo[i], lr[i], adv[i], mask[i])) for i in range(N)]
    np.testing.assert_allclose(vm, loop, atol=ATOL)
    # [B, G, T] input: seq_mean_token_mean over B·G sequences == mean of the per-prompt losses
    cfg2 = _cfg(0.28)
    full = grpo_loss_j(P.PolicyInputs(lp, lo, lr, adv, mask), cfg=cfg2, kl_coef=0.04, entropy_coef=0.0)[0]
    per = [
        grpo_loss_j(
            PolicyInputs(lp[i], lo[i], lr[i], adv[i], mask[i]), cfg=cfg2, kl_coef=0.04, entropy_coef=0.0
        )[0]
        for i in range(N)
    ]
    np.testing.assert_allclose(full, np.mean(per), atol=ATOL)


# ------------------------------------------------------------------------------------------------------------
# T6 — GSPO
# ------------------------------------------------------------------------------------------------------------


def test_t6_gspo():
    lp_old = jnp.array([[-1.0, -1.0, -1.0, 0.0]])
    lp = lp_old + jnp.array([[0.1, -0.2, 0.4, 7.0]])  # token log-ratios 0.1, −0.2, 0.4 (+ one padded token)
    mask = jnp.array([[1, 1, 1, 0]], jnp.float32)
    np.testing.assert_allclose(S.gspo_sequence_ratio(lp, lp_old, mask), [1.105171], atol=ATOL)
    np.testing.assert_allclose(jax.jit(S.gspo_sequence_ratio)(lp, lp_old, mask), [1.105171], atol=ATOL)
    tok = S.gspo_token_ratio(lp, lp_old, mask)
    np.testing.assert_allclose(tok[0, :3], [1.105171] * 3, atol=ATOL)
    tok_j = jax.jit(S.gspo_token_ratio)(lp, lp_old, mask)
    np.testing.assert_allclose(tok_j[0, :3], [1.105171] * 3, atol=ATOL)
    # d/dlogp of Σ_t s_{i,t} (GSPO-token) is s_i per token; of s_i (GSPO) it is s_i/|o_i|.
    g_tok = jax.grad(lambda x: (S.gspo_token_ratio(x, lp_old, mask) * mask).sum())(lp)
    np.testing.assert_allclose(g_tok[0, :3], [1.105171] * 3, atol=ATOL)
    g_seq = jax.grad(lambda x: S.gspo_sequence_ratio(x, lp_old, mask).sum())(lp)
    np.testing.assert_allclose(g_seq[0], [1.105171 / 3] * 3 + [0.0], atol=ATOL)

    cfg = PolicyLossConfig(eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean", importance_level="sequence")
    for a, obj in ((1.0, 1.000400), (-1.0, -1.105171)):
        loss, aux = grpo_loss_j(
            PolicyInputs(lp, lp_old, None, jnp.array([a]), mask), cfg=cfg, kl_coef=0.0, entropy_coef=0.0
        )
        np.testing.assert_allclose(loss, -obj, atol=ATOL)
        np.testing.assert_allclose(aux.ratio_mean, 1.105171, atol=ATOL)
        np.testing.assert_allclose(aux.clip_high_frac, 1.0 if a > 0 else 0.0, atol=ATOL)


def test_gspo_token_gradient_equals_gspo_when_unclipped():
    rng = np.random.default_rng(2)
    lp_old = jnp.array(rng.normal(-1.0, 0.3, (2, 3, 4)), jnp.float32)
    lp = lp_old + jnp.array(rng.normal(0.0, 0.05, (2, 3, 4)), jnp.float32)
    mask = jnp.array([[[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]] * 2, jnp.float32)
    adv = jnp.array(rng.normal(size=(2, 3)), jnp.float32)

    @functools.partial(jax.jit, static_argnames=("level",))
    def vg(x, level):
        cfg = PolicyLossConfig(eps_low=0.9, eps_high=10.0, importance_level=level)
        f = lambda y: P.policy_loss(
            P.PolicyInputs(y, lp_old, None, adv, mask), cfg=cfg, kl_coef=0.0, entropy_coef=0.0
        )[0]
        return jax.value_and_grad(f)(x)

    (v_seq, g_seq), (v_tok, g_tok) = vg(lp, "sequence"), vg(lp, "sequence_token")
    np.testing.assert_allclose(v_seq, v_tok, atol=ATOL)
    np.testing.assert_allclose(g_seq * mask, g_tok * mask, atol=ATOL)


# ------------------------------------------------------------------------------------------------------------
# T7 — DAPO soft overlong punishment
# ------------------------------------------------------------------------------------------------------------


def test_t7_soft_overlong():
    lengths = jnp.array([16000, 16384, 18432, 20480, 20481])
    expected = [0.0, 0.0, -0.5, -1.0, -1.0]
    np.testing.assert_allclose(
        ADV.soft_overlong_punishment(lengths, max_len=20480, cache_len=4096), expected, atol=ATOL
    )
    f = jax.jit(functools.partial(ADV.soft_overlong_punishment, max_len=20480, cache_len=4096))
    np.testing.assert_allclose(f(lengths), expected, atol=ATOL)
    np.testing.assert_allclose(
        ADV.soft_overlong_punishment(jnp.array(90), max_len=100, cache_len=20), -0.5, atol=ATOL
    )  # TRL docstring example
    with pytest.raises(ValueError, match="cache_len"):
        ADV.soft_overlong_punishment(lengths, max_len=10, cache_len=20)


# ------------------------------------------------------------------------------------------------------------
# entropy
# ------------------------------------------------------------------------------------------------------------


def test_entropy_from_logits():
    logits = jnp.array(
        [[0.0, 0.0, 0.0, 0.0], [0.0, -jnp.inf, -jnp.inf, -jnp.inf], [1.0, 1.0, -jnp.inf, -jnp.inf]]
    )
    expected = [1.386294, 0.0, 0.693147]  # log 4, 0, log 2
    np.testing.assert_allclose(AGG.entropy_from_logits(logits), expected, atol=ATOL)
    np.testing.assert_allclose(
        jax.jit(AGG.entropy_from_logits)(logits.astype(jnp.bfloat16)), expected, atol=ATOL
    )
    assert AGG.entropy_from_logits(logits.astype(jnp.bfloat16)).dtype == jnp.float32


# ------------------------------------------------------------------------------------------------------------
# T8 — GAE and PPO
# ------------------------------------------------------------------------------------------------------------


def test_t8_gae():
    r = jnp.array([[0.0, 0.0, 1.0, 0.0]])  # padded to width 4
    v = jnp.array([[0.5, 0.6, 0.7, 9.0]])
    m = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    for gamma, adv_exp, ret_exp in (
        (1.0, [0.46575, 0.385, 0.3], [0.96575, 0.985, 1.0]),
        (0.99, [0.446829, 0.37515, 0.3], [0.946829, 0.97515, 1.0]),
    ):
        adv, ret = V.gae(r, v, m, gamma=gamma, lam=0.95)
        np.testing.assert_allclose(adv, [adv_exp + [0.0]], atol=ATOL)
        np.testing.assert_allclose(ret, [ret_exp + [0.0]], atol=ATOL)
        f = jax.jit(functools.partial(V.gae, gamma=gamma, lam=0.95))
        np.testing.assert_allclose(f(r, v, m)[0], [adv_exp + [0.0]], atol=ATOL)
    # bootstrap value after a truncated sequence: the last δ gets γ·last_value
    adv, _ = V.gae(r, v, m, gamma=1.0, lam=0.95, last_value=jnp.array([1.0]))
    np.testing.assert_allclose(adv[0, 2], 1.3, atol=ATOL)


def test_t8_kl_shaped_rewards_then_gae():
    lp = jnp.array([[-1.0, -0.5, -2.0, 0.0]])
    lr = jnp.array([[-1.2, -0.5, -1.5, 4.0]])
    m = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    shaped = V.kl_shaped_rewards(jnp.array([1.0]), lp, lr, m, kl_coef=0.05, kind="k1")
    np.testing.assert_allclose(shaped, [[-0.01, 0.0, 1.025, 0.0]], atol=ATOL)
    f = jax.jit(functools.partial(V.kl_shaped_rewards, kind="k1"))
    np.testing.assert_allclose(
        f(jnp.array([1.0]), lp, lr, m, kl_coef=0.05), [[-0.01, 0.0, 1.025, 0.0]], atol=ATOL
    )
    adv, ret = V.gae(shaped, jnp.array([[0.5, 0.6, 0.7, 0.0]]), m, gamma=1.0, lam=0.95)
    np.testing.assert_allclose(adv, [[0.478312, 0.40875, 0.325, 0.0]], atol=ATOL)
    np.testing.assert_allclose(ret, [[0.978312, 1.00875, 1.025, 0.0]], atol=ATOL)


def test_t8_value_loss_and_ppo_loss():
    one = jnp.ones((1, 1))
    loss, clip_frac = V.clipped_value_loss(0.9 * one, 0.5 * one, 1.0 * one, one, eps_v=0.2)
    np.testing.assert_allclose(loss, 0.045, atol=ATOL)
    np.testing.assert_allclose(clip_frac, 1.0, atol=ATOL)
    np.testing.assert_allclose(
        jax.jit(functools.partial(V.clipped_value_loss, eps_v=0.2))(0.9 * one, 0.5 * one, one, one)[0],
        0.045,
        atol=ATOL,
    )
    # PPO (the one PPO loss: the LM's and the MLP agent's): the four T2 tokens (ε 0.2, token mean): objectives
    # [1.2, −1.221403, 0.740818, −0.8]; value pieces of T8.
    from grpo_jax.algorithms.ppo import ppo_loss

    lp = jnp.array([[-0.8, -0.8, -1.3, -1.3]])
    lo = -jnp.ones((1, 4))
    adv = jnp.array([[1.0, -1.0, 1.0, -1.0]])
    m = jnp.ones((1, 4))
    pg = -(1.2 - 1.221403 + 0.740818 - 0.8) / 4
    cfg = PolicyLossConfig(aggregation="token_mean", entropy_bonus="token_mean")
    kw = dict(cfg=cfg, vf_coef=0.1, cliprange_value=0.2)
    for fn in (ppo_loss, jax.jit(ppo_loss, static_argnames=("cfg", "vf_coef", "cliprange_value"))):
        total, (aux, vaux) = fn(lp, lo, None, 0.9 * m, 0.5 * m, adv, m, m, **kw)
        np.testing.assert_allclose(aux.pg_loss, pg, atol=ATOL)
        np.testing.assert_allclose(vaux.vf_loss, 0.045, atol=ATOL)
        np.testing.assert_allclose(total, pg + 0.1 * 0.045, atol=ATOL)
        np.testing.assert_allclose(aux.clip_region_frac, 0.5, atol=ATOL)
    total, _ = ppo_loss(lp, lo, None, 0.9 * m, 0.5 * m, adv, m, m, entropy_coef=0.01, entropy=2.0 * m, **kw)
    np.testing.assert_allclose(total, pg + 0.1 * 0.045 - 0.02, atol=ATOL)


# ------------------------------------------------------------------------------------------------------------
# config validation
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(eps_low=-0.1), "eps_low"),
        (dict(eps_high="0.2"), "eps_high"),
        (dict(dual_clip=0.5), "dual_clip"),
        (dict(delta=1.0), "delta"),
        (dict(kl_estimator="k4"), "kl_estimator"),
        (dict(kl_anchor="policy"), "kl_anchor"),
        (dict(kl_bias_correction=1), "kl_bias_correction"),
        (dict(aggregation="sum"), "aggregation"),
        (dict(max_len=0), "max_len"),
        (dict(importance_level="seq"), "importance_level"),
        (dict(tis_cap=0.0), "tis_cap"),
    ],
)
def test_config_validation(kw, field):
    with pytest.raises(ValueError, match=field):
        PolicyLossConfig(**kw)


def test_constant_aggregation_without_max_len_fails_at_use():
    # the config may leave L unset (the run config derives it from max_new_tokens); the loss refuses to guess
    cfg = PolicyLossConfig(aggregation="constant")
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="max_len"):
        P.policy_loss(
            P.PolicyInputs(x, x, None, jnp.zeros((2,)), jnp.ones((2, 3))),
            cfg=cfg,
            kl_coef=0.0,
            entropy_coef=0.0,
        )


def test_config_defaults_and_hashable():
    cfg = PolicyLossConfig()
    assert (cfg.eps_low, cfg.eps_high, cfg.kl_estimator, cfg.kl_anchor) == (0.2, 0.2, "k3", "ref")
    assert cfg.aggregation == "seq_mean_token_mean" and cfg.importance_level == "token"
    assert hash(cfg) == hash(PolicyLossConfig())
    with pytest.raises(AttributeError):
        cfg.eps_low = 0.3
