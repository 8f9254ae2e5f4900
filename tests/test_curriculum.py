"""Tests for grpo_jax.curriculum (docs/GRPO_MATH.md §3 row 13) with hand-derived literal values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import curriculum as C

ATOL = 1e-6

# 5 problems on 3 levels: problems 0,1 -> level 0; 2,3 -> level 1; 4 -> level 2.
LEVELS_NP = np.array([0, 0, 1, 1, 2])
LEVELS = jnp.asarray(LEVELS_NP, jnp.int32)
NUM_LEVELS = 3


def _upd(state, cfg, idx, passes, counts):
    return C.update(
        state,
        cfg,
        LEVELS,
        jnp.array(idx, jnp.int32),
        jnp.array(passes, jnp.float32),
        jnp.array(counts, jnp.int32),
    )


# ------------------------------------------------------------------------------------------------------------
# config and init
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(kind="prioritized"), "kind"),
        (dict(ema=1.0), "ema"),
        (dict(floor=0.0), "floor"),
        (dict(prior=1.5), "prior"),
        (dict(start_level=-1), "start_level"),
        (dict(promote=0.0), "promote"),
        (dict(promote=0.5, demote=0.5), "demote"),
        (dict(min_attempts=0), "min_attempts"),
    ],
)
def test_config_validation_names_field(kw, field):
    with pytest.raises(ValueError, match=f"CurriculumConfig.{field}="):
        C.CurriculumConfig(**kw)


def test_config_is_hashable():
    assert hash(C.CurriculumConfig(kind="levels")) == hash(C.CurriculumConfig(kind="levels"))


def test_init_values_and_checks():
    cfg = C.CurriculumConfig(kind="levels", prior=0.25, start_level=1)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    np.testing.assert_array_equal(s.pass_rate, [0.25] * 5)
    assert s.pass_rate.dtype == jnp.float32 and s.attempts.dtype == jnp.int32
    np.testing.assert_array_equal(s.attempts, [0] * 5)
    np.testing.assert_array_equal(s.level_rate, [0.25] * 3)
    np.testing.assert_array_equal(s.level_attempts, [0] * 3)
    assert int(s.max_level) == 1 and s.max_level.dtype == jnp.int32
    with pytest.raises(ValueError, match="hold no problems"):
        C.init(np.array([0, 0, 2]), 3, cfg)  # level 1 empty
    with pytest.raises(ValueError, match=r"\[0, num_levels=2\)"):
        C.init(LEVELS_NP, 2, cfg)  # level 2 out of range
    with pytest.raises(ValueError, match="start_level=3"):
        C.init(LEVELS_NP, NUM_LEVELS, C.CurriculumConfig(start_level=3))


# ------------------------------------------------------------------------------------------------------------
# EMA arithmetic
# ------------------------------------------------------------------------------------------------------------


def test_ema_one_and_two_updates():
    cfg = C.CurriculumConfig(ema=0.9, prior=0.0, min_attempts=1000)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    s = _upd(s, cfg, [0, 1], [0.5, 0.25], [8, 8])
    # First observations replace the prior: s = [0.5, 0.25, 0, 0, 0].
    np.testing.assert_allclose(s.pass_rate, [0.5, 0.25, 0.0, 0.0, 0.0], atol=ATOL)
    np.testing.assert_array_equal(s.attempts, [8, 8, 0, 0, 0])
    # Level 0 pools 4 + 2 successes of 16 samples = 0.375 (first observation of the level: replaces).
    np.testing.assert_allclose(s.level_rate, [0.375, 0.0, 0.0], atol=ATOL)
    np.testing.assert_array_equal(s.level_attempts, [16, 0, 0])

    s = _upd(s, cfg, [0, 1], [1.0, 0.0], [8, 8])
    # s0 = 0.9*0.5 + 0.1*1 = 0.55; s1 = 0.9*0.25 + 0.1*0 = 0.225.
    np.testing.assert_allclose(s.pass_rate, [0.55, 0.225, 0.0, 0.0, 0.0], atol=ATOL)
    np.testing.assert_array_equal(s.attempts, [16, 16, 0, 0, 0])
    # Level 0: obs 8/16 = 0.5 -> 0.9*0.375 + 0.1*0.5 = 0.3875; 32 samples, but min_attempts 1000 -> no change.
    np.testing.assert_allclose(s.level_rate, [0.3875, 0.0, 0.0], atol=ATOL)
    np.testing.assert_array_equal(s.level_attempts, [32, 0, 0])
    assert int(s.max_level) == 0


def test_prior_is_replaced_by_first_observation():
    cfg = C.CurriculumConfig(kind="pass_rate", ema=0.9, prior=0.5)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    s = _upd(s, cfg, [2], [0.0], [8])
    # Replaced (0.0), NOT blended (0.9*0.5 = 0.45); untouched problems keep the prior 0.5.
    np.testing.assert_allclose(s.pass_rate, [0.5, 0.5, 0.0, 0.5, 0.5], atol=ATOL)
    # The prior drives sampling before any attempt: w = max(1 - s, 0.05) = [0.5, 0.5, 1, 0.5, 0.5] / 3.
    np.testing.assert_allclose(
        C.probabilities(s, cfg, LEVELS), [1 / 6, 1 / 6, 1 / 3, 1 / 6, 1 / 6], atol=ATOL
    )


def test_duplicates_are_pooled_and_padding_ignored():
    cfg = C.CurriculumConfig(ema=0.9, min_attempts=1000)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    s = _upd(s, cfg, [2], [0.5], [8])  # s2 = 0.5, level1 = 0.5
    s2 = _upd(s, cfg, [2, 2, 3, 4], [1.0, 0.5, 0.75, 1.0], [4, 4, 8, 0])
    # q2 pools (4 + 2)/8 = 0.75 -> 0.9*0.5 + 0.1*0.75 = 0.525; q3 first obs 0.75; q4 (counts 0) untouched.
    np.testing.assert_allclose(s2.pass_rate, [0.0, 0.0, 0.525, 0.75, 0.0], atol=ATOL)
    np.testing.assert_array_equal(s2.attempts, [0, 0, 16, 8, 0])
    # Level 1 pools (4 + 2 + 6)/16 = 0.75 -> 0.9*0.5 + 0.1*0.75 = 0.525; level 2 unobserved.
    np.testing.assert_allclose(s2.level_rate, [0.0, 0.525, 0.0], atol=ATOL)
    np.testing.assert_array_equal(s2.level_attempts, [0, 24, 0])
    # The two q2 rows act exactly like one pooled row (0.75 of 8).
    s3 = _upd(s, cfg, [2, 3], [0.75, 0.75], [8, 8])
    np.testing.assert_allclose(s3.pass_rate, s2.pass_rate, atol=ATOL)
    np.testing.assert_allclose(s3.level_rate, s2.level_rate, atol=ATOL)


# ------------------------------------------------------------------------------------------------------------
# probabilities
# ------------------------------------------------------------------------------------------------------------

S = jnp.array([0.0, 0.5, 1.0, 0.97, 0.2], jnp.float32)


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("uniform", [0.2] * 5),
        # max_level = 1 unlocks problems 0..3.
        ("levels", [0.25, 0.25, 0.25, 0.25, 0.0]),
        # w = max(1 - s, 0.05) = [1, 0.5, 0.05, 0.05, 0.8], sum 2.4.
        ("pass_rate", [1 / 2.4, 0.5 / 2.4, 0.05 / 2.4, 0.05 / 2.4, 0.8 / 2.4]),
        # w masked = [1, 0.5, 0.05, 0.05, 0], sum 1.6 -> [0.625, 0.3125, 0.03125, 0.03125, 0].
        ("levels+pass_rate", [0.625, 0.3125, 0.03125, 0.03125, 0.0]),
    ],
)
def test_probabilities_each_kind(kind, expected):
    cfg = C.CurriculumConfig(kind=kind, floor=0.05)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)._replace(pass_rate=S, max_level=jnp.asarray(1, jnp.int32))
    p = C.probabilities(s, cfg, LEVELS)
    assert p.dtype == jnp.float32
    np.testing.assert_allclose(p, expected, atol=ATOL)
    np.testing.assert_allclose(float(p.sum()), 1.0, atol=ATOL)


# ------------------------------------------------------------------------------------------------------------
# promotion / demotion
# ------------------------------------------------------------------------------------------------------------


def test_promotion_after_min_attempts_and_never_past_last_level():
    cfg = C.CurriculumConfig(kind="levels", ema=0.5, promote=0.6, demote=0.1, min_attempts=16)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    s = _upd(s, cfg, [0], [1.0], [8])
    # Level 0 rate 1.0 >= 0.6 but only 8 < 16 samples: not trusted yet.
    assert int(s.max_level) == 0
    np.testing.assert_array_equal(s.level_attempts, [8, 0, 0])
    s = _upd(s, cfg, [1], [0.5], [8])
    # Level 0 rate 0.5*1 + 0.5*0.5 = 0.75 >= 0.6 with 16 samples -> promote to 1; attempts restart.
    assert int(s.max_level) == 1
    np.testing.assert_allclose(s.level_rate, [0.75, 0.0, 0.0], atol=ATOL)
    np.testing.assert_array_equal(s.level_attempts, [0, 0, 0])
    s = _upd(s, cfg, [2, 3], [1.0, 1.0], [8, 8])
    assert int(s.max_level) == 2  # level 1: 1.0 with 16 samples
    s = _upd(s, cfg, [4], [1.0], [32])
    # Level 2 is the last: rate 1.0 with 32 samples, still 2, and attempts are NOT reset (no change).
    assert int(s.max_level) == 2
    np.testing.assert_array_equal(s.level_attempts, [0, 0, 32])


def test_level_rate_restarts_after_a_change():
    cfg = C.CurriculumConfig(kind="levels", ema=0.5, promote=0.6, min_attempts=16)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    s = _upd(s, cfg, [0, 1], [1.0, 0.5], [8, 8])  # level 0: 12/16 = 0.75 -> promote
    assert int(s.max_level) == 1
    s = _upd(s, cfg, [0], [0.25], [8])
    # First level-0 observation since the change replaces 0.75 (no blend to 0.5).
    np.testing.assert_allclose(s.level_rate[0], 0.25, atol=ATOL)


def test_at_most_one_level_change_per_update():
    cfg = C.CurriculumConfig(kind="uniform", promote=0.6, min_attempts=16)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    # Levels 0 AND 1 both qualify (rate 1, 16 samples), yet max_level moves 0 -> 1 only.
    s = _upd(s, cfg, [0, 2], [1.0, 1.0], [16, 16])
    assert int(s.max_level) == 1
    np.testing.assert_array_equal(s.level_attempts, [0, 0, 0])


def test_demotion():
    cfg = C.CurriculumConfig(kind="levels", ema=0.5, promote=0.6, demote=0.1, min_attempts=16)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)._replace(max_level=jnp.asarray(2, jnp.int32))
    s = _upd(s, cfg, [4], [0.0], [8])
    assert int(s.max_level) == 2  # rate 0 < 0.1 but 8 < 16 samples
    s = _upd(s, cfg, [4], [0.0625], [8])
    # Level 2: 0.5*0 + 0.5*0.0625 = 0.03125 < 0.1 with 16 samples -> demote to 1, attempts restart.
    np.testing.assert_allclose(s.level_rate[2], 0.03125, atol=ATOL)
    assert int(s.max_level) == 1
    np.testing.assert_array_equal(s.level_attempts, [0, 0, 0])


def test_never_demote_below_start_level():
    cfg = C.CurriculumConfig(kind="levels", start_level=1, demote=0.1, min_attempts=16)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    s = _upd(s, cfg, [2, 3], [0.0, 0.0], [16, 16])  # level 1: rate 0 with 32 samples
    assert int(s.max_level) == 1
    np.testing.assert_array_equal(s.level_attempts, [0, 32, 0])  # no change -> no reset


# ------------------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------------------


def test_sample_distinct_unlocked_and_deterministic():
    cfg = C.CurriculumConfig(kind="levels+pass_rate")
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)._replace(max_level=jnp.asarray(1, jnp.int32))
    for seed in range(20):
        key = jax.random.key(seed)
        idx = np.asarray(C.sample(s, cfg, LEVELS, key, 3))
        assert idx.dtype == np.int32 and idx.shape == (3,)
        assert len(set(idx.tolist())) == 3
        assert set(idx.tolist()) <= {0, 1, 2, 3}  # problem 4 (level 2) is locked
        np.testing.assert_array_equal(idx, C.sample(s, cfg, LEVELS, key, 3))


def test_sample_fallback_when_too_few_unlocked():
    cfg = C.CurriculumConfig(kind="levels")
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)  # only problems 0, 1 unlocked
    for seed in range(20):
        idx = np.asarray(C.sample(s, cfg, LEVELS, jax.random.key(seed), 4)).tolist()
        assert len(set(idx)) == 4
        assert set(idx[:2]) == {0, 1}  # every unlocked problem first, then locked fill-ins
    assert sorted(np.asarray(C.sample(s, cfg, LEVELS, jax.random.key(0), 5)).tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="n=6"):
        C.sample(s, cfg, LEVELS, jax.random.key(0), 6)


@pytest.mark.parametrize("kind", ["pass_rate", "levels+pass_rate"])
def test_sampling_frequencies_follow_probabilities(kind):
    cfg = C.CurriculumConfig(kind=kind, floor=0.05)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)._replace(pass_rate=S, max_level=jnp.asarray(1, jnp.int32))
    p = np.asarray(C.probabilities(s, cfg, LEVELS), np.float64)
    draws = 4000
    keys = jax.random.split(jax.random.key(123), draws)
    idx = jax.vmap(lambda k: C.sample(s, cfg, LEVELS, k, 1))(keys)[:, 0]
    freq = np.bincount(np.asarray(idx), minlength=5) / draws
    sigma = np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(freq - p) <= 3 * sigma + 1e-12), (freq, p)


# ------------------------------------------------------------------------------------------------------------
# jit and logging
# ------------------------------------------------------------------------------------------------------------


def test_jit_matches_eager():
    cfg = C.CurriculumConfig(kind="levels+pass_rate", ema=0.5, min_attempts=16)
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)
    upd = jax.jit(C.update, static_argnums=1)
    smp = jax.jit(C.sample, static_argnums=(1, 4))
    batches = [([0, 1, 1], [1.0, 0.5, 1.0], [8, 4, 4]), ([2, 3, 0], [0.25, 0.5, 1.0], [8, 8, 8])]
    for idx, passes, counts in batches:
        args = (jnp.array(idx, jnp.int32), jnp.array(passes, jnp.float32), jnp.array(counts, jnp.int32))
        eager = C.update(s, cfg, LEVELS, *args)
        jitted = upd(s, cfg, LEVELS, *args)
        for a, b in zip(eager, jitted, strict=True):
            np.testing.assert_allclose(a, b, atol=ATOL)
        s = eager
    key = jax.random.key(7)
    np.testing.assert_array_equal(smp(s, cfg, LEVELS, key, 3), C.sample(s, cfg, LEVELS, key, 3))


def test_level_rates_metrics():
    cfg = C.CurriculumConfig()
    s = C.init(LEVELS_NP, NUM_LEVELS, cfg)._replace(level_rate=jnp.array([0.5, 0.25, 0.0], jnp.float32))
    m = jax.jit(C.level_rates)(s)
    assert set(m) == {
        "curriculum/level0_pass_rate",
        "curriculum/level1_pass_rate",
        "curriculum/level2_pass_rate",
        "curriculum/max_level",
    }
    assert float(m["curriculum/level1_pass_rate"]) == 0.25 and int(m["curriculum/max_level"]) == 0
