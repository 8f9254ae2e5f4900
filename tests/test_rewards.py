"""Tests for verdict -> reward conversion (grpo_jax/codegen/rewards.py), with hand-built verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_jax.codegen import rewards
from grpo_jax.sandbox.types import Status, Verdict
from grpo_jax.sandbox.types import TestResult as _TestResult

OK = _TestResult(passed=True, status=Status.PASSED)
WA = _TestResult(passed=False, status=Status.WRONG_ANSWER)
RE = _TestResult(passed=False, status=Status.RUNTIME_ERROR)

VERDICTS = [
    Verdict(status=Status.PASSED, passed=True, tests=(OK, OK, OK)),  # 3 tests, all pass
    Verdict(status=Status.WRONG_ANSWER, passed=False, tests=(OK, WA, OK, RE)),  # 4 tests, 2 pass
    Verdict(status=Status.SYNTAX_ERROR, passed=False, tests=()),  # 2 tests, none ran
    Verdict(status=Status.TIMEOUT, passed=False, tests=(OK,)),  # 3 tests, stopped after the first
    Verdict(status=Status.PASSED, passed=True, tests=(), child_check_passed=True),  # child check only
    Verdict(status=Status.WRONG_ANSWER, passed=False, tests=(OK, OK), child_check_passed=False),
    Verdict(status=Status.INFRA_ERROR, passed=False, tests=()),  # 1 test
]
TESTS_PER_SAMPLE = [3, 4, 2, 3, 0, 2, 1]


def test_all_pass_rewards():
    r = rewards.all_pass_rewards(VERDICTS)
    assert r.dtype == np.float32 and r.shape == (7,)
    np.testing.assert_array_equal(r, [1, 0, 0, 0, 1, 0, 0])
    assert rewards.all_pass_rewards([]).shape == (0,)


def test_per_test_rewards():
    values, mask = rewards.per_test_rewards(VERDICTS, 4, TESTS_PER_SAMPLE)
    assert values.dtype == mask.dtype == np.float32 and values.shape == mask.shape == (7, 4)
    np.testing.assert_array_equal(
        values,
        [
            [1, 1, 1, 0],
            [1, 0, 1, 0],
            [0, 0, 0, 0],
            [1, 0, 0, 0],
            [0, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 0, 0, 0],
        ],
    )
    np.testing.assert_array_equal(
        mask,
        [
            [1, 1, 1, 0],
            [1, 1, 1, 1],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
            [0, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 0, 0, 0],
        ],
    )
    assert (values <= mask).all()


def test_per_test_rewards_errors():
    with pytest.raises(ValueError, match="exceeds num_tests=3"):
        rewards.per_test_rewards(VERDICTS, 3, TESTS_PER_SAMPLE)
    with pytest.raises(ValueError, match="7 verdicts"):
        rewards.per_test_rewards(VERDICTS, 4, TESTS_PER_SAMPLE[:3])
    with pytest.raises(ValueError, match="verdict 1 has 4 test results"):
        rewards.per_test_rewards(VERDICTS, 4, [3, 3, 2, 3, 0, 2, 1])


def test_pass_fraction():
    r = rewards.pass_fraction(VERDICTS, TESTS_PER_SAMPLE)
    assert r.dtype == np.float32
    np.testing.assert_allclose(r, [1.0, 0.5, 0.0, 1 / 3, 1.0, 2 / 3, 0.0], rtol=1e-6)
    # A failed verdict never scores 1, even if every reported test passed (e.g. an output limit at the end).
    odd = Verdict(status=Status.OUTPUT_LIMIT, passed=False, tests=(OK, OK))
    np.testing.assert_allclose(rewards.pass_fraction([odd], [2]), [0.5])
    # pass_fraction == 1 exactly where all_pass == 1
    np.testing.assert_array_equal(r == 1.0, rewards.all_pass_rewards(VERDICTS) == 1.0)


def test_failure_counts():
    counts = rewards.failure_counts(VERDICTS)
    assert counts == {
        "passed": 2,
        "wrong_answer": 2,
        "runtime_error": 0,
        "syntax_error": 1,
        "timeout": 1,
        "memory": 0,
        "output_limit": 0,
        "infra_error": 1,
    }
    assert set(rewards.failure_counts([])) == {s.value for s in Status}
    assert sum(rewards.failure_counts([]).values()) == 0


def test_valid_mask():
    np.testing.assert_array_equal(rewards.valid_mask(VERDICTS), [1, 1, 1, 1, 1, 1, 0])


def test_rewards_from_verdicts():
    np.testing.assert_array_equal(rewards.rewards_from_verdicts(VERDICTS), rewards.all_pass_rewards(VERDICTS))
    np.testing.assert_array_equal(
        rewards.rewards_from_verdicts(VERDICTS, kind="pass_fraction", tests_per_sample=TESTS_PER_SAMPLE),
        rewards.pass_fraction(VERDICTS, TESTS_PER_SAMPLE),
    )
    with pytest.raises(ValueError, match="tests_per_sample"):
        rewards.rewards_from_verdicts(VERDICTS, kind="pass_fraction")
    with pytest.raises(ValueError, match="valid kinds"):
        rewards.rewards_from_verdicts(VERDICTS, kind="dense")


def test_child_checked_fractions():
    # samples 4 and 5 have child checks (child_check_passed is not None); of the 2 passed samples, 1 is child
    assert rewards.child_checked_fractions(VERDICTS) == {
        "child_checked_frac": 2 / 7,
        "child_checked_reward_frac": 0.5,
    }
    none = {"child_checked_frac": 0.0, "child_checked_reward_frac": 0.0}
    assert rewards.child_checked_fractions([]) == none
    assert rewards.child_checked_fractions(VERDICTS[:2])["child_checked_reward_frac"] == 0.0
