"""Multi-scale (outcome + per-test sub-goal) advantages: literal hand-computed values, reductions, masking.

Hand arithmetic used below (G = 4, z-score with ddof = 1, eps = 0):
  column [1,0,0,0]: mean 1/4, deviations (3/4, -1/4, -1/4, -1/4), var = (9/16 + 3/16)/3 = 1/4, std = 1/2
                    -> [1.5, -0.5, -0.5, -0.5]
  column [1,1,1,0]: the mirror image -> [0.5, 0.5, 0.5, -1.5]
  column [0,1,0,0]: -> [-0.5, 1.5, -0.5, -0.5]
  all-equal column: -> [0, 0, 0, 0]
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.codegen.rewards import all_pass_rewards, per_test_rewards
from grpo_jax.core.advantages import compute_advantages
from grpo_jax.core.multiscale import multi_scale_advantages
from grpo_jax.sandbox import types as sbt

ATOL = 1e-5
S3 = np.sqrt(3.0)

# B = 3 problems, G = 4 members, M = 3 test slots.
#   problem 0: 3 real tests; member 0 passes all (outcome 1), members 1,2 pass 2 of 3, member 3 passes 1.
#   problem 1: 2 real tests (slot 2 is padding, filled with garbage that must be ignored); nobody passes
#              both, so the outcome group is all-fail; member 0 passes test 0 only, member 1 test 1 only.
#   problem 2: 0 real tests (every slot padding, garbage values); outcome [0,1,0,0].
OUTCOME = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]], np.float32)
PER_TEST = np.array(
    [
        # columns: test 0, test 1, test 2
        [[1, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 0]],
        [[1, 0, 1], [0, 1, 0], [0, 0, 1], [0, 0, 0]],  # slot 2 = padding garbage
        [[1, 1, 0], [0, 0, 1], [1, 0, 1], [0, 1, 1]],  # all padding garbage
    ],
    np.float32,
)
TEST_MASK = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]], np.float32)


def _msa(**kw):
    kw.setdefault("eps", 0.0)
    return multi_scale_advantages(OUTCOME, PER_TEST, TEST_MASK, **kw)


def test_mean_of_tests_literal_values():
    out = _msa(per_test_mode="mean_of_tests", w_outcome=1.0, w_tests=0.5)
    # outcome: problem 0 is column [1,0,0,0]; problem 1 all-equal -> 0; problem 2 is [0,1,0,0]
    exp_outcome = [[1.5, -0.5, -0.5, -0.5], [0, 0, 0, 0], [-0.5, 1.5, -0.5, -0.5]]
    # problem 0: test 0 = [1,0,0,0] -> [1.5,-.5,-.5,-.5]; test 1 = [1,1,1,1] (all pass) -> 0;
    #            test 2 = [1,1,1,0] -> [.5,.5,.5,-1.5]. Mean over 3 tests: [2/3, 0, 0, -2/3].
    # problem 1: test 0 = [1,0,0,0] -> [1.5,-.5,-.5,-.5]; test 1 = [0,1,0,0] -> [-.5,1.5,-.5,-.5];
    #            slot 2 ignored. Mean over 2 tests: [0.5, 0.5, -0.5, -0.5].
    # problem 2: no real test -> 0.
    exp_tests = [[2 / 3, 0, 0, -2 / 3], [0.5, 0.5, -0.5, -0.5], [0, 0, 0, 0]]
    # total = 1 * outcome + 0.5 * tests:
    #   problem 0: [1.5 + 1/3, -0.5, -0.5, -0.5 - 1/3]; problem 1: [.25, .25, -.25, -.25]; problem 2 = outcome
    exp_total = [[1.5 + 1 / 3, -0.5, -0.5, -0.5 - 1 / 3], [0.25, 0.25, -0.25, -0.25], [-0.5, 1.5, -0.5, -0.5]]
    np.testing.assert_allclose(out.outcome, exp_outcome, atol=ATOL)
    np.testing.assert_allclose(out.tests, exp_tests, atol=ATOL)
    np.testing.assert_allclose(out.total, exp_total, atol=ATOL)
    for x in out:
        assert x.dtype == jnp.float32 and x.shape == (3, 4)


def test_fraction_literal_values():
    out = _msa(per_test_mode="fraction", w_outcome=2.0, w_tests=0.5)
    # problem 0 pass fractions [3/3, 2/3, 2/3, 1/3]: mean 2/3, deviations (1/3, 0, 0, -1/3),
    #   var = (2/9)/3 = 2/27, std = sqrt(2/27); (1/3)/sqrt(2/27) = sqrt(27/18) = sqrt(1.5) = 1.224745
    # problem 1 fractions over the 2 real tests [1/2, 1/2, 0, 0]: mean 1/4, deviations ±1/4,
    #   var = (4/16)/3 = 1/12, std = 1/sqrt(12); (1/4)*sqrt(12) = sqrt(3)/2 = 0.866025
    # problem 2: no real test -> 0
    r15 = np.sqrt(1.5)
    exp_tests = [[r15, 0, 0, -r15], [S3 / 2, S3 / 2, -S3 / 2, -S3 / 2], [0, 0, 0, 0]]
    exp_outcome = [[1.5, -0.5, -0.5, -0.5], [0, 0, 0, 0], [-0.5, 1.5, -0.5, -0.5]]
    # total = 2 * outcome + 0.5 * tests
    exp_total = 2.0 * np.array(exp_outcome) + 0.5 * np.array(exp_tests)
    np.testing.assert_allclose(out.outcome, exp_outcome, atol=ATOL)
    np.testing.assert_allclose(out.tests, exp_tests, atol=ATOL)
    np.testing.assert_allclose(out.total, exp_total, atol=ATOL)
    # e.g. problem 0 member 0: 2 * 1.5 + 0.5 * 1.224745 = 3.612372
    assert float(out.total[0, 0]) == pytest.approx(3.612372, abs=ATOL)


def test_default_eps_and_ddof0_literal():
    # TRL default eps = 1e-4, ddof = 1: [1,0,0,0] -> 0.75 / (0.5 + 1e-4) = 1.4997 (docs/GRPO_MATH.md §1.9)
    out = _msa(eps=1e-4, w_tests=0.0)
    assert float(out.outcome[0, 0]) == pytest.approx(0.75 / 0.5001, abs=ATOL)
    # ddof = 0, eps = 0: [1,0,0,0] std = sqrt(3/16) = sqrt(3)/4 -> 0.75 / (sqrt(3)/4) = sqrt(3) = 1.732051
    # problem 1 tests: each column gives [S3, -1/S3, -1/S3, -1/S3] / [-1/S3, S3, -1/S3, -1/S3]:
    #   mean over 2 tests, member 0: (S3 - 1/S3)/2 = (1/S3) = 0.577350; member 2: -1/S3
    out0 = _msa(ddof=0, w_tests=1.0)
    np.testing.assert_allclose(out0.outcome[0], [S3, -1 / S3, -1 / S3, -1 / S3], atol=ATOL)
    np.testing.assert_allclose(out0.tests[1], [1 / S3, 1 / S3, -1 / S3, -1 / S3], atol=ATOL)


def test_all_fail_outcome_group_still_gets_signal():
    # The point of the mechanism: problem 1 has no all-pass member, so plain GRPO gives it 0 everywhere ...
    plain = compute_advantages(OUTCOME, method="grpo", eps=1e-4)
    np.testing.assert_array_equal(plain[1], 0.0)
    for mode in ("mean_of_tests", "fraction"):
        out = multi_scale_advantages(OUTCOME, PER_TEST, TEST_MASK, per_test_mode=mode)
        np.testing.assert_array_equal(out.outcome[1], 0.0)
        # ... but members that passed more tests get a positive total advantage, the others negative.
        total = np.asarray(out.total[1])
        assert np.all(np.abs(total) > 0.1), (mode, total)
        assert total[0] > 0 and total[1] > 0 and total[2] < 0 and total[3] < 0


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo", "batch_std"])
@pytest.mark.parametrize("mode", ["mean_of_tests", "fraction"])
def test_w_tests_zero_is_plain_advantage(method, mode):
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1]], np.float32)
    out = multi_scale_advantages(
        OUTCOME, PER_TEST, TEST_MASK, w_tests=0.0, method=method, per_test_mode=mode, mask=mask
    )
    ref = compute_advantages(OUTCOME, method=method, ddof=1, eps=1e-4, mask=mask)
    np.testing.assert_array_equal(out.total, ref)
    np.testing.assert_array_equal(out.outcome, ref)


def test_masked_members_literal_and_zero():
    # member 3 of problem 0 masked out -> groups of 3 (ddof = 1, eps = 0):
    #   column [1,0,0]: mean 1/3, deviations (2/3, -1/3, -1/3), var = (4/9 + 2/9)/2 = 1/3, std = 1/sqrt(3)
    #     -> [2/sqrt(3), -1/sqrt(3), -1/sqrt(3)] = [1.154701, -0.577350, -0.577350]
    #   outcome [1,0,0] -> that; test 0 [1,0,0] -> that; test 1 [1,1,1] -> 0; test 2 [1,1,1] -> 0
    #   (member 3 was the only one failing test 2). tests = [2/S3, -1/S3, -1/S3] / 3.
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], np.float32)
    out = _msa(mask=mask, w_tests=0.5)
    a = np.array([2 / S3, -1 / S3, -1 / S3, 0.0])
    np.testing.assert_allclose(out.outcome[0], a, atol=ATOL)
    np.testing.assert_allclose(out.tests[0], a / 3, atol=ATOL)
    # total: 1.154701 + 0.5 * 0.384900 = 1.347151; -0.577350 - 0.5 * 0.192450 = -0.673575
    np.testing.assert_allclose(out.total[0], [1.347151, -0.673575, -0.673575, 0.0], atol=ATOL)
    for x in out:
        assert float(x[0, 3]) == 0.0
    # masking a member equals dropping it (garbage in the masked slot changes nothing)
    garbage = PER_TEST.copy()
    garbage[0, 3] = [7.0, -3.0, 5.0]
    out_g = multi_scale_advantages(OUTCOME, garbage, TEST_MASK, mask=mask, eps=0.0)
    for x, y in zip(out, out_g, strict=True):
        np.testing.assert_array_equal(x, y)
    sub = multi_scale_advantages(OUTCOME[:1, :3], PER_TEST[:1, :3], TEST_MASK[:1], eps=0.0)
    for x, y in zip(out, sub, strict=True):
        np.testing.assert_allclose(x[0, :3], y[0], atol=1e-6)


def test_padding_tests_are_ignored():
    garbage = PER_TEST.copy()
    garbage[1, :, 2] = [0, 1, 1, 1]
    garbage[2] = 1.0 - garbage[2]
    for mode in ("mean_of_tests", "fraction"):
        a = multi_scale_advantages(OUTCOME, PER_TEST, TEST_MASK, per_test_mode=mode)
        b = multi_scale_advantages(OUTCOME, garbage, TEST_MASK, per_test_mode=mode)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_single_test_reduces_to_its_column():
    # M = 1: both modes equal the plain advantage of that test's 0/1 column
    pt = PER_TEST[:2, :, :1]
    tm = np.ones((2, 1), np.float32)
    ref = compute_advantages(pt[..., 0], method="grpo")
    for mode in ("mean_of_tests", "fraction"):
        out = multi_scale_advantages(OUTCOME[:2], pt, tm, per_test_mode=mode)
        np.testing.assert_allclose(out.tests, ref, atol=1e-6)


def test_jit_equals_no_jit():
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]], np.float32)
    for mode in ("mean_of_tests", "fraction"):

        def f(o, p, t, m, w, mode=mode):
            return multi_scale_advantages(o, p, t, mask=m, w_tests=w, per_test_mode=mode)

        eager = f(OUTCOME, PER_TEST, TEST_MASK, mask, 0.5)
        jitted = jax.jit(f)(OUTCOME, PER_TEST, TEST_MASK, mask, jnp.float32(0.5))
        for x, y in zip(eager, jitted, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-6)


def test_no_nan_with_eps_zero_on_all_equal_columns():
    # every column all-equal (all pass / all fail), all-equal outcomes, an empty problem, a fully masked group
    outcome = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    pt = np.stack([np.ones((4, 3)), np.zeros((4, 3)), np.ones((4, 3))]).astype(np.float32)
    tm = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]], np.float32)
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
    for mode in ("mean_of_tests", "fraction"):
        for method in ("grpo", "dr_grpo", "rloo", "batch_std"):
            out = multi_scale_advantages(
                outcome, pt, tm, eps=0.0, ddof=1, mask=mask, method=method, per_test_mode=mode
            )
            for x in out:
                np.testing.assert_array_equal(x, 0.0)
            g = jax.grad(lambda p, mode=mode: multi_scale_advantages(outcome, p, tm, eps=0.0).total.sum())(
                jnp.asarray(pt)
            )
            assert np.all(np.isfinite(g))


def test_built_from_sandbox_verdicts():
    # the pipeline glue: per_test_rewards [N, M] -> [B, G, M]; its mask is constant over a problem's samples
    def v(results, n):
        tests = tuple(
            sbt.TestResult(passed=p, status=sbt.Status.PASSED if p else sbt.Status.WRONG_ANSWER)
            for p in results
        )
        ok = len(results) == n and all(results)
        return sbt.Verdict(
            status=sbt.Status.PASSED if ok else sbt.Status.WRONG_ANSWER, passed=ok, tests=tests
        )

    # problem 0 (3 tests) and problem 1 (2 tests) of the literal example; sample 3 of problem 0 stopped early
    rows = [[1, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1], [1, 0], [0, 1], [0, 0], [0, 0]]
    counts = [3, 3, 3, 3, 2, 2, 2, 2]
    verdicts = [v([bool(x) for x in r], n) for r, n in zip(rows, counts, strict=True)]
    vals, vmask = per_test_rewards(verdicts, 3, counts)
    outcome = all_pass_rewards(verdicts).reshape(2, 4)
    out = multi_scale_advantages(
        outcome, vals.reshape(2, 4, 3), vmask.reshape(2, 4, 3)[:, 0, :], eps=0.0, w_tests=0.5
    )
    exp = _msa(w_tests=0.5)
    for x, y in zip(out, exp, strict=True):
        np.testing.assert_allclose(x, y[:2], atol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="per_test_mode"):
        _msa(per_test_mode="sum")
    with pytest.raises(ValueError, match="method"):
        _msa(method="scaled_baseline")
    with pytest.raises(ValueError, match="method"):
        _msa(method="ppo")
    with pytest.raises(AssertionError):
        multi_scale_advantages(OUTCOME, PER_TEST, TEST_MASK[:, :2])
