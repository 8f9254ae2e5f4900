"""Statistics over seeds for sweeps and reports: pure numpy (no JAX), every result reproducible.

    bootstrap_ci(values)                      mean over seeds, percentile-bootstrap confidence interval
    paired_bootstrap_ci(arm, base)            mean of arm − base over the seeds both have, bootstrap interval
    wilson_interval(successes, n)             a rate (e.g. runs that collapsed) with the Wilson score interval
    completions_to_threshold(steps, values, threshold, completions_per_step)
                                              sampled completions until a learning curve first reaches a value

Percentile bootstrap (Efron & Tibshirani 1993, §13.3): draw `resamples` samples of size n with replacement
from the n values (numpy's default_rng(seed): the same call gives the same interval), take the mean of each,
and report the (1 − c)/2 and (1 + c)/2 quantiles of those means (numpy's default linear interpolation).
With few seeds the interval is too narrow rather than too wide (it never reaches beyond the values seen);
with one value it is that value.

Wilson score interval (Wilson 1927) for k successes in n trials, z = Φ⁻¹((1 + c)/2), p̂ = k/n:

    centre = (p̂ + z²/2n) / (1 + z²/n),   half-width = z / (1 + z²/n) · sqrt(p̂(1 − p̂)/n + z²/4n²)

(inside [0, 1] for every k, unlike p̂ ± z·sqrt(p̂(1 − p̂)/n), which is [0, 0] at k = 0).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np

DEFAULT_RESAMPLES = 10_000


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval: `value` in [`low`, `high`] at `confidence`, from `n` values."""

    value: float
    low: float
    high: float
    n: int
    confidence: float = 0.95


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence}: must be in (0, 1), e.g. 0.95")


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """The mean of `values` with its percentile-bootstrap interval (NaN interval when there is no value)."""
    _check_confidence(confidence)
    if resamples < 1:
        raise ValueError(f"resamples={resamples}: must be >= 1")
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"bootstrap_ci: every value must be finite, got {x.tolist()}")
    n = int(x.size)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, confidence)
    mean = float(x.mean())
    if n == 1:
        return Estimate(mean, mean, mean, 1, confidence)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    low, high = np.quantile(means, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return Estimate(mean, float(low), float(high), n, confidence)


def paired_differences(arm: Mapping[int, float], base: Mapping[int, float]) -> tuple[list[int], np.ndarray]:
    """(the seeds both arms have, sorted; arm[s] − base[s] for each of them)."""
    common = sorted(set(arm) & set(base))
    return common, np.asarray([arm[s] - base[s] for s in common], dtype=np.float64)


def paired_bootstrap_ci(
    arm: Mapping[int, float],
    base: Mapping[int, float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Mean paired difference arm − base over their common seeds, with its bootstrap interval (the seeds
    are resampled as pairs, so what the two arms share per seed, e.g. the warm start, cancels)."""
    _, d = paired_differences(arm, base)
    return bootstrap_ci(d, resamples=resamples, confidence=confidence, seed=seed)


def z_value(confidence: float = 0.95) -> float:
    """Φ⁻¹((1 + confidence) / 2): 1.959964 at 0.95."""
    _check_confidence(confidence)
    return NormalDist().inv_cdf((1.0 + confidence) / 2.0)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """The rate successes / n with its Wilson score interval (NaN when n = 0)."""
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"wilson_interval({successes}, {n}): need 0 <= successes <= n")
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, confidence)
    z = z_value(confidence)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n))
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n, confidence)


def completions_to_threshold(
    steps: Sequence[int], values: Sequence[float], threshold: float, completions_per_step: float
) -> float:
    """Completions sampled until the curve first reaches `threshold`: (the first step, in step order, whose
    value is >= threshold) × completions_per_step; 0 when the first point (e.g. step 0, after SFT) already
    reaches it; math.inf when no point does. NaN values are points without a measurement."""
    if len(steps) != len(values):
        raise ValueError(f"completions_to_threshold: {len(steps)} steps but {len(values)} values")
    for s, v in sorted(zip(steps, values, strict=True), key=lambda sv: sv[0]):
        if not math.isnan(v) and v >= threshold:
            return float(s) * float(completions_per_step)
    return math.inf
