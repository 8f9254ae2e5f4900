"""Verdicts -> rewards (host side, numpy only): all-pass, per-test vectors, pass fraction.

Length shaping (DAPO soft overlong punishment, in tokens): grpo_jax.core.advantages.soft_overlong_punishment.

Shapes: N samples (N = B * G flattened in rollout order), M = the largest number of tests of any problem.
Every function takes the sandbox's `Verdict`s (one per sample, in order) and returns float32 arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from grpo_jax.sandbox.types import Status, Verdict

REWARD_KINDS: tuple[str, ...] = ("all_pass", "pass_fraction")


def all_pass_rewards(verdicts: Sequence[Verdict]) -> np.ndarray:
    """r_i = 1 if sample i passed every test (and its child check), else 0. float32 [N]."""
    return np.asarray([1.0 if v.passed else 0.0 for v in verdicts], dtype=np.float32).reshape(len(verdicts))


def _check_counts(verdicts: Sequence[Verdict], tests_per_sample: Sequence[int]) -> list[int]:
    counts = [int(n) for n in tests_per_sample]
    if len(counts) != len(verdicts):
        raise ValueError(f"tests_per_sample has {len(counts)} entries for {len(verdicts)} verdicts")
    for i, (v, n) in enumerate(zip(verdicts, counts, strict=True)):
        if n < 0:
            raise ValueError(f"tests_per_sample[{i}]={n} is negative")
        if len(v.tests) > n:
            raise ValueError(f"verdict {i} has {len(v.tests)} test results but tests_per_sample[{i}]={n}")
    return counts


def per_test_rewards(
    verdicts: Sequence[Verdict], num_tests: int, tests_per_sample: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per-test reward vectors: (values [N, num_tests], mask [N, num_tests]), both float32.

    values[i, j] = 1 iff test j of sample i ran and passed; mask[i, j] = 1 iff the problem of sample i has a
    test j (j < tests_per_sample[i]). A program that failed before its tests ran (syntax error, timeout,
    early stop, ...) has fewer (or no) test results: its missing tests count as failed, value 0, mask 1.
    """
    counts = _check_counts(verdicts, tests_per_sample)
    if counts and max(counts) > num_tests:
        i = int(np.argmax(counts))
        raise ValueError(f"tests_per_sample[{i}]={counts[i]} exceeds num_tests={num_tests}")
    values = np.zeros((len(verdicts), num_tests), dtype=np.float32)
    mask = np.zeros((len(verdicts), num_tests), dtype=np.float32)
    for i, (v, n) in enumerate(zip(verdicts, counts, strict=True)):
        mask[i, :n] = 1.0
        for j, t in enumerate(v.tests):
            values[i, j] = 1.0 if t.passed else 0.0
    return values, mask


def pass_fraction(verdicts: Sequence[Verdict], tests_per_sample: Sequence[int]) -> np.ndarray:
    """Dense reward: the fraction of a sample's gradable units that passed. float32 [N].

    Units are the problem's parent-graded tests (tests_per_sample[i], missing results count as failed) plus
    the child check where the verdict reports one (child_check_passed is not None). A passed verdict scores
    exactly 1; a failed one at most (units - 1) / units; a sample with no units scores 1 if passed else 0.
    So the reward is 1 iff the all-pass reward is 1.
    """
    counts = _check_counts(verdicts, tests_per_sample)
    out = np.zeros(len(verdicts), dtype=np.float32)
    for i, (v, n) in enumerate(zip(verdicts, counts, strict=True)):
        if v.passed:
            out[i] = 1.0
            continue
        units = n + (v.child_check_passed is not None)
        good = sum(t.passed for t in v.tests) + bool(v.child_check_passed)
        # A failed verdict never reaches 1: if every unit passed yet the verdict failed (e.g. an output limit
        # hit after the tests), one unit counts as failed.
        out[i] = min(good, units - 1) / units if units else 0.0
    return out


def failure_counts(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """{status value: count} over every `Status` (zeros included), e.g. {"passed": 3, "timeout": 0, ...}."""
    counts = {s.value: 0 for s in Status}
    for v in verdicts:
        counts[Status(v.status).value] += 1
    return counts


def child_checked_fractions(verdicts: Sequence[Verdict]) -> dict[str, float]:
    """How much of the reward came from child checks (asserts that could not be parent-graded and ran in the
    two-process checker) rather than from parent-graded tests alone:
    {"child_checked_frac": share of samples whose problem has a child check,
     "child_checked_reward_frac": share of the passed samples among those}. Both 0.0 when nothing applies."""
    n = len(verdicts)
    child = [v.child_check_passed is not None for v in verdicts]
    passed = [v.passed for v in verdicts]
    n_pass = sum(passed)
    return {
        "child_checked_frac": sum(child) / n if n else 0.0,
        "child_checked_reward_frac": sum(c and p for c, p in zip(child, passed, strict=True)) / n_pass
        if n_pass
        else 0.0,
    }


def valid_mask(verdicts: Sequence[Verdict]) -> np.ndarray:
    """1 for samples whose verdict says something about the program, 0 for INFRA_ERROR (the sandbox failed,
    not the program): a trainer may drop those from the loss instead of punishing them. float32 [N]."""
    return np.asarray([0.0 if v.status == Status.INFRA_ERROR else 1.0 for v in verdicts], dtype=np.float32)


def rewards_from_verdicts(
    verdicts: Sequence[Verdict], *, kind: str = "all_pass", tests_per_sample: Sequence[int] | None = None
) -> np.ndarray:
    """The scalar reward per sample, float32 [N]: kind "all_pass" (sparse) or "pass_fraction" (dense)."""
    if kind == "all_pass":
        return all_pass_rewards(verdicts)
    if kind == "pass_fraction":
        if tests_per_sample is None:
            raise ValueError('rewards_from_verdicts(kind="pass_fraction") needs tests_per_sample')
        return pass_fraction(verdicts, tests_per_sample)
    raise ValueError(f"unknown reward kind {kind!r}; valid kinds are {REWARD_KINDS}")
