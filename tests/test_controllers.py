"""Tests for grpo_jax.core.controllers against docs/GRPO_MATH.md §4 T9 (literal expected values)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.core import controllers as C

ATOL = 1e-6


def _set(state, **kw):
    return state._replace(**{k: jnp.float32(v) for k, v in kw.items()})


SEED_ROWS = [  # (β, H, new β) — the seed document's rule, target entropy 2.0
    (0.01, 1.5, 0.012),
    (0.01, 2.5, 0.008),
    (0.01, 2.0, 0.01),  # dead band
    (0.019, 1.0, 0.02),  # upper cap
    (0.0011, 3.0, 0.001),  # floor
]


def test_t9_seed_entropy_rule():
    ctrl = C.seed_entropy_controller(init_coef=0.01, target=2.0)
    upd = jax.jit(ctrl.update)
    for beta, h, new in SEED_ROWS:
        state = _set(ctrl.init(), coef=beta)
        np.testing.assert_allclose(ctrl.update(state, h).coef, new, atol=ATOL)
        np.testing.assert_allclose(upd(state, jnp.float32(h)).coef, new, atol=ATOL)


def test_t9_skywork_entropy():
    ctrl = C.skywork_entropy_controller(init_coef=0.01, target=0.2, delta=0.005)
    upd = jax.jit(ctrl.update)
    app = jax.jit(ctrl.applied)
    for h, applied, nxt in ((0.15, 0.01, 0.015), (0.3, 0.0, 0.005)):
        for fn, ap in ((ctrl.update, ctrl.applied), (upd, app)):
            s = fn(ctrl.init(), jnp.float32(h))
            np.testing.assert_allclose((ap(ctrl.init(), jnp.float32(h)), s.coef), (applied, nxt), atol=ATOL)
    # the coefficient never goes below min_coef and respects max_coef
    s = ctrl.update(_set(ctrl.init(), coef=0.002), 0.5)
    np.testing.assert_allclose(s.coef, 0.0, atol=ATOL)
    capped = C.skywork_entropy_controller(init_coef=0.01, max_coef=0.012)
    np.testing.assert_allclose(capped.update(capped.init(), 0.1).coef, 0.012, atol=ATOL)


def test_t9_ppo_adaptive_kl():
    ctrl = C.ppo_adaptive_kl_controller(init_coef=1.0, target=0.01)
    upd = jax.jit(ctrl.update)
    for d, new in ((0.003, 0.5), (0.02, 2.0), (0.01, 1.0)):
        np.testing.assert_allclose(ctrl.update(ctrl.init(), d).coef, new, atol=ATOL)
        np.testing.assert_allclose(upd(ctrl.init(), jnp.float32(d)).coef, new, atol=ATOL)


def test_t9_ziegler_kl():
    ctrl = C.ziegler_kl_controller(init_coef=0.1, target=6.0, horizon=10000)
    upd = jax.jit(ctrl.update)
    for kl, new in ((9.0, 0.100512), (5.0, 0.099573)):
        np.testing.assert_allclose(ctrl.update(ctrl.init(), kl, 256).coef, new, atol=ATOL)
        np.testing.assert_allclose(upd(ctrl.init(), jnp.float32(kl), jnp.int32(256)).coef, new, atol=ATOL)


def test_constant_and_make_controller():
    ctrl = C.constant_controller(0.04)
    s = ctrl.update(ctrl.init(), 123.0)
    np.testing.assert_allclose(s.coef, 0.04, atol=ATOL)
    np.testing.assert_allclose(jax.jit(ctrl.update)(ctrl.init(), jnp.float32(1.0)).coef, 0.04, atol=ATOL)
    np.testing.assert_allclose(C.make_controller("constant", init_coef=0.3).init().coef, 0.3, atol=ATOL)
    with pytest.raises(ValueError, match="coef"):
        C.constant_controller()
    ctrl = C.make_controller("ppo_adaptive_kl", init_coef=1.0, target=0.01)
    np.testing.assert_allclose(ctrl.update(ctrl.init(), 0.003).coef, 0.5, atol=ATOL)
    measures = {}
    for kind in C.CONTROLLER_KINDS:
        kw = dict(init_coef=0.1, target=6.0, horizon=100) if kind == "ziegler_kl" else {}
        kw = dict(coef=0.1) if kind == "constant" else kw
        c = C.make_controller(kind, **kw)
        assert isinstance(c, C.Controller)
        s = c.update(c.init(), 1.0, n_steps=1)  # uniform calling convention
        assert np.shape(s.coef) == () and s.coef.dtype == jnp.float32
        a = c.applied(c.init(), jnp.float32(1.0))
        assert np.shape(a) == () and a.dtype == jnp.float32
        measures[kind] = c.measures
    assert measures == {
        "seed_entropy": "entropy",
        "skywork_entropy": "entropy",
        "ppo_adaptive_kl": "kl",
        "ziegler_kl": "kl",
        "constant": "none",
    }
    # every kind but Skywork applies its current coefficient whatever the measurement
    seed = C.make_controller("seed_entropy", init_coef=0.01)
    np.testing.assert_allclose(seed.applied(seed.init(), 99.0), 0.01, atol=ATOL)
    with pytest.raises(
        ValueError, match="seed_entropy.*skywork_entropy.*ppo_adaptive_kl.*ziegler_kl.*constant"
    ):
        C.make_controller("sac")


def test_ziegler_defaults_are_trls():
    c = C.ziegler_kl_controller()  # TRL PPOConfig: init 0.05, target 6, horizon 10000
    np.testing.assert_allclose(c.init().coef, 0.05, atol=ATOL)
    # KL 9 -> e = 0.2; n = 256: 0.05 * (1 + 0.2 * 256 / 10000) = 0.050256
    np.testing.assert_allclose(c.update(c.init(), 9.0, n_steps=256).coef, 0.050256, atol=ATOL)


def test_piecewise_controller_is_the_seed_beta_schedule():
    # the seed's staged β by step: 0.03 for [0, 100), 0.01 for [100, 500), 0.005 from 500
    c = C.piecewise_controller((100, 500), (0.03, 0.01, 0.005))
    upd = jax.jit(c.update)
    s = c.init()
    got = []
    for _ in range(600):
        got.append(float(c.applied(s, 0.0)))
        s = upd(s, jnp.float32(0.0))
    assert got[0] == pytest.approx(0.03) and got[99] == pytest.approx(0.03)
    assert got[100] == pytest.approx(0.01) and got[499] == pytest.approx(0.01)
    assert got[500] == pytest.approx(0.005) and got[599] == pytest.approx(0.005)
    assert int(s.t) == 600 and c.measures == "none"
    assert upd._cache_size() == 1


@pytest.mark.parametrize("kind", ["seed_entropy", "skywork_entropy", "ppo_adaptive_kl"])
def test_update_does_not_retrace_when_coef_changes(kind):
    ctrl = C.make_controller(kind)
    traces = []

    def update(state, value):
        traces.append(1)
        return ctrl.update(state, value)

    upd = jax.jit(update)
    state = ctrl.init()
    coefs = []
    for h in (0.1, 5.0, 0.1, 0.1, 5.0):
        state = upd(state, jnp.float32(h))
        coefs.append(float(state.coef))
    state = upd(_set(state, coef=0.5), jnp.float32(1.0))  # an externally changed coefficient
    assert len(set(coefs)) > 1
    assert len(traces) == 1


def test_ziegler_no_retrace():
    ctrl = C.ziegler_kl_controller(0.1, 6.0, 10000)
    traces = []

    @jax.jit
    def upd(state, kl, n):
        traces.append(1)
        return ctrl.update(state, kl, n)

    s = ctrl.init()
    for kl in (9.0, 5.0, 1.0):
        s = upd(s, jnp.float32(kl), jnp.int32(256))
    assert len(traces) == 1


def test_piecewise_constant_boundaries_and_seed_schedule():
    beta = C.piecewise_constant((100, 500), (0.03, 0.01, 0.005))  # the seed's β and K schedules
    pool = C.piecewise_constant((100, 500), (8, 16, 32))
    steps = [0, 99, 100, 499, 500, 10_000]
    np.testing.assert_allclose(
        [float(beta(s)) for s in steps], [0.03, 0.03, 0.01, 0.01, 0.005, 0.005], atol=ATOL
    )
    assert [int(pool(s)) for s in steps] == [8, 8, 16, 16, 32, 32]
    assert jnp.issubdtype(pool(0).dtype, jnp.integer)
    # traced step, one trace
    traces = []

    @jax.jit
    def both(step):
        traces.append(1)
        return beta(step), pool(step)

    got = [both(jnp.int32(s)) for s in steps]
    np.testing.assert_allclose([float(b) for b, _ in got], [0.03, 0.03, 0.01, 0.01, 0.005, 0.005], atol=ATOL)
    assert [int(k) for _, k in got] == [8, 8, 16, 16, 32, 32]
    assert len(traces) == 1
    with pytest.raises(ValueError, match="len"):
        C.piecewise_constant([100], [1.0])
    with pytest.raises(ValueError, match="increasing"):
        C.piecewise_constant([100, 100], [1.0, 2.0, 3.0])


def test_linear_schedule():
    sched = C.linear(1.0, 0.0, 10)
    np.testing.assert_allclose([float(sched(s)) for s in (0, 5, 10, 20)], [1.0, 0.5, 0.0, 0.0], atol=ATOL)
    np.testing.assert_allclose(jax.jit(sched)(jnp.int32(5)), 0.5, atol=ATOL)
    with pytest.raises(ValueError, match="steps"):
        C.linear(1.0, 0.0, 0)
