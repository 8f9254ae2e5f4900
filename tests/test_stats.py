"""grpo_jax.stats: every formula against numbers derived by hand (or by exact enumeration) in the comments."""

import math

import numpy as np
import pytest

from grpo_jax import stats


def test_bootstrap_ci_equals_the_exact_bootstrap_quantiles():
    # The exact bootstrap distribution of the mean of 4 draws with replacement from {1, 2, 3, 4}: the sum S of
    # four "dice" with faces 1..4 takes 4, 5, 6, 7, ... in 1, 4, 10, 20, ... of the 4^4 = 256 equally likely
    # resamples (compositions: C(s-1, 3) for s <= 7). P(S <= 5) = 5/256 = 0.0195 < 0.025 < P(S <= 6) = 15/256
    # = 0.0586, so the 2.5 % quantile of the mean is 6/4 = 1.5, and by symmetry the 97.5 % one is 14/4 = 3.5.
    # Both lie well inside a block of probability mass, so 10 000 Monte Carlo resamples land on them exactly.
    # (A normal interval would give 2.5 ± 1.96 · 1.118/2 = [1.404, 3.596] instead.)
    e = stats.bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert (e.value, e.low, e.high, e.n) == (2.5, 1.5, 3.5, 4)
    # 80 %: P(S <= 6) = 15/256 = 0.0586 < 0.10 < P(S <= 7) = 35/256 = 0.137: the 10 % quantile is 7/4 = 1.75
    e80 = stats.bootstrap_ci([4.0, 1.0, 3.0, 2.0], confidence=0.8)
    assert (e80.value, e80.low, e80.high) == (2.5, 1.75, 3.25)


def test_bootstrap_ci_is_reproducible_and_uses_its_arguments():
    x = [0.31, 0.28, 0.42, 0.35, 0.30, 0.39, 0.27, 0.33]
    a, b = stats.bootstrap_ci(x, seed=3), stats.bootstrap_ci(x, seed=3)
    assert a == b  # a fixed RNG seed: the same interval every time
    assert a.low < a.value < a.high and a.value == pytest.approx(np.mean(x), abs=1e-15)
    # the seed and the number of resamples are used (with 10 000 resamples the quantiles of these 8 values
    # fall on the same resample means for any seed; with 200 they move)
    assert stats.bootstrap_ci(x, seed=3, resamples=200) != stats.bootstrap_ci(x, seed=4, resamples=200)
    one = stats.bootstrap_ci(x, resamples=1)  # one resample: both quantiles are its mean
    assert one.low == one.high != a.low
    # one value: the interval is that value; none: NaN
    assert stats.bootstrap_ci([0.5]) == stats.Estimate(0.5, 0.5, 0.5, 1)
    empty = stats.bootstrap_ci([])
    assert empty.n == 0 and math.isnan(empty.value) and math.isnan(empty.low)
    with pytest.raises(ValueError, match="finite"):
        stats.bootstrap_ci([0.1, math.inf])
    with pytest.raises(ValueError, match="confidence"):
        stats.bootstrap_ci(x, confidence=95)


def test_paired_differences_use_only_common_seeds_as_pairs():
    arm = {0: 0.41, 1: 0.32, 2: 0.53, 3: 0.64, 9: 0.90}
    base = {0: 0.40, 1: 0.30, 2: 0.50, 3: 0.60, 7: 0.10}
    seeds, d = stats.paired_differences(arm, base)
    assert seeds == [0, 1, 2, 3]
    np.testing.assert_allclose(d, [0.01, 0.02, 0.03, 0.04], atol=1e-15)
    # differences 1..4 hundredths: the exact bootstrap of test 1 scaled by 1/100: mean 0.025, [0.015, 0.035]
    e = stats.paired_bootstrap_ci(arm, base)
    assert e.n == 4
    assert (e.value, e.low, e.high) == pytest.approx((0.025, 0.015, 0.035), abs=1e-12)
    # unpaired, the same seeds would give mean(arm) − mean(base) over all their seeds: 0.56 − 0.38 = 0.18
    assert abs(e.value - 0.18) > 0.1
    assert stats.paired_bootstrap_ci({1: 0.5}, {2: 0.5}).n == 0  # no common seed: nothing to compare


def test_wilson_interval_literal_values():
    # 3 of 8 at 95 %: z = 1.959964, z² = 3.841459, z²/n = 0.480182, p̂ = 0.375;
    # centre = (0.375 + 0.240091) / 1.480182 = 0.415551;
    # half = 1.959964 / 1.480182 · sqrt(0.375 · 0.625 / 8 + 3.841459 / 256) = 1.324139 · 0.210483 = 0.278707
    e = stats.wilson_interval(3, 8)
    assert e.value == 0.375 and e.n == 8
    assert (e.low, e.high) == pytest.approx((0.136844, 0.694258), abs=2e-6)
    # 0 of 8: [0, z²/(n + z²)] = [0, 3.841459 / 11.841459] = [0, 0.324408]; 8 of 8 mirrors it
    z0, z8 = stats.wilson_interval(0, 8), stats.wilson_interval(8, 8)
    assert z0.low == 0.0 and z0.high == pytest.approx(0.324408, abs=2e-6)
    assert z8.high == 1.0 and z8.low == pytest.approx(1 - 0.324408, abs=2e-6)
    # 90 %: z = 1.644854, z² = 2.705543; 3 of 8: centre (0.375 + 0.169096) / 1.338193 = 0.406590,
    # half 1.229160 · sqrt(0.029297 + 0.010568) = 1.229160 · 0.199663 = 0.245418
    e90 = stats.wilson_interval(3, 8, confidence=0.9)
    assert (e90.low, e90.high) == pytest.approx((0.161172, 0.652008), abs=2e-6)
    assert stats.z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert math.isnan(stats.wilson_interval(0, 0).value)
    with pytest.raises(ValueError):
        stats.wilson_interval(9, 8)


def test_completions_to_threshold():
    steps, pass1 = [0, 20, 40, 60, 80], [0.30, 0.35, 0.42, 0.39, 0.45]
    # first step with pass@1 >= 0.40 is 40: 40 steps × 16 prompts × G 8 = 5 120 completions
    assert stats.completions_to_threshold(steps, pass1, 0.40, 128) == 5120.0
    assert stats.completions_to_threshold(steps, pass1, 0.45, 128) == 80 * 128  # reached exactly at the end
    assert stats.completions_to_threshold(steps, pass1, 0.30, 128) == 0.0  # the post-SFT point already
    assert stats.completions_to_threshold(steps, pass1, 0.50, 128) == math.inf  # never
    # step order, not list order; NaN = not measured
    assert stats.completions_to_threshold([40, 0, 20], [0.5, 0.1, 0.6], 0.5, 10) == 200.0
    assert stats.completions_to_threshold([0, 20, 40], [0.1, math.nan, 0.7], 0.5, 10) == 400.0
    with pytest.raises(ValueError):
        stats.completions_to_threshold([0, 1], [0.1], 0.5, 1)
