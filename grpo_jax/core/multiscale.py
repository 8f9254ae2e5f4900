"""Multi-scale advantages: the sparse all-pass outcome plus per-test sub-goal advantages.

What this is, honestly (docs/GRPO_MATH.md §3 row 14): the seed document's "multi-scale advantage (sub-goals)",
RENAMED. No GRPO paper defines it. Its nearest published relatives are
  * DeepSeekMath process supervision (arXiv 2402.03300 §4.1.3; `advantages.process_advantages`), which
    normalises per-STEP rewards within the group and sums them over later steps, and
  * partial-credit / dense rewards such as the pass fraction of a program's tests
    (`grpo_jax.codegen.rewards.pass_fraction`).
It is NOT process supervision: a unit test is a property of the whole program, not a step of it, there are no
step boundaries, and every token of a completion gets the same advantage (like outcome supervision). What it
adds over the sparse reward: a group in which no member passes every test (outcome advantage 0 everywhere,
so no policy gradient) still gets a learning signal from the tests some members pass and others fail.

Shapes: B problems, G completions per problem, M = the largest number of tests of any problem in the batch.
  outcome  [B, G]     the sparse reward (1 iff every test passed; `rewards.all_pass_rewards`)
  per_test [B, G, M]  1 where that test passed (`rewards.per_test_rewards` values, reshaped to [B, G, M])
  test_mask [B, M]    1 for the problem's real tests, 0 for padding (the per-sample mask of `per_test_rewards`
                      is constant over a problem's G samples: take its [:, 0, :])
  mask     [B, G]     valid group members (as in `advantages.compute_advantages`); None = all valid

    outcome_adv = A(outcome)                                            (A = compute_advantages, `method`)
    "mean_of_tests":  tests_adv[b, i] = Σ_m test_mask[b, m] · A(per_test[b, :, m])[i] / Σ_m test_mask[b, m]
        every test is its own group-relative sub-goal; a test that all members pass (or all fail) gives 0
    "fraction":       tests_adv = A( Σ_m per_test · test_mask / Σ_m test_mask )      (one pass-fraction group)
    total = w_outcome · outcome_adv + w_tests · tests_adv

Problems with no real test get tests_adv = 0; masked members get 0 in every field. Pure, jit-safe, float32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from grpo_jax.core.advantages import ADV_METHODS, compute_advantages

PER_TEST_MODES = ("mean_of_tests", "fraction")


class MultiScaleAdvantages(NamedTuple):
    total: jax.Array  # [B, G] w_outcome * outcome + w_tests * tests
    outcome: jax.Array  # [B, G] group advantage of the sparse outcome reward (unweighted)
    tests: jax.Array  # [B, G] per-test sub-goal advantage (unweighted)


def multi_scale_advantages(
    outcome: jax.Array,
    per_test: jax.Array,
    test_mask: jax.Array,
    *,
    w_outcome: float | jax.Array = 1.0,
    w_tests: float | jax.Array = 0.5,
    method: str = "grpo",
    ddof: int = 1,
    eps: float = 1e-4,
    mask: jax.Array | None = None,
    per_test_mode: str = "mean_of_tests",
) -> MultiScaleAdvantages:
    """Outcome advantage + weighted per-test sub-goal advantage (see the module docstring for the formulas
    and for why this is a renamed seed idea and not process supervision).

    outcome [B, G], per_test [B, G, M], test_mask [B, M], mask [B, G] | None. `method`, `ddof`, `eps` go to
    `compute_advantages` for the outcome AND for every sub-goal group ("scaled_baseline" is not supported:
    there is no per-test baseline). Padding tests (test_mask 0) never enter any statistic, whatever their
    values. With method="batch_std" the sub-goal batch std runs over every (real test, valid member) entry.
    Returns MultiScaleAdvantages(total, outcome, tests), each [B, G] float32.
    """
    if method not in ADV_METHODS or method == "scaled_baseline":
        valid = tuple(m for m in ADV_METHODS if m != "scaled_baseline")
        raise ValueError(f"multi_scale_advantages: method={method!r}; valid methods are {valid}.")
    if per_test_mode not in PER_TEST_MODES:
        raise ValueError(
            f"multi_scale_advantages: per_test_mode={per_test_mode!r}; valid modes are {PER_TEST_MODES}."
        )
    r = jnp.asarray(outcome, jnp.float32)  # [B,G]
    pt = jnp.asarray(per_test, jnp.float32)  # [B,G,M]
    tm = jnp.asarray(test_mask).astype(jnp.float32)  # [B,M]
    chex.assert_rank([r, pt, tm], [2, 3, 2])
    chex.assert_equal_shape_prefix([r, pt], 2)
    chex.assert_equal_shape([pt[:, 0, :], tm])
    m = jnp.ones_like(r) if mask is None else jnp.asarray(mask).astype(jnp.float32)
    chex.assert_equal_shape([r, m])
    advantages = functools.partial(compute_advantages, method=method, ddof=ddof, eps=eps)

    outcome_adv = advantages(r, mask=m) * m  # [B,G]
    n_tests = tm.sum(-1)  # [B]
    has_tests = (n_tests > 0)[:, None]  # [B,1]
    if per_test_mode == "mean_of_tests":
        cols = jnp.swapaxes(pt, 1, 2)  # [B,M,G]: one group per (problem, test)
        col_mask = tm[:, :, None] * m[:, None, :]  # [B,M,G]: padding tests are empty groups
        col_adv = advantages(jnp.where(col_mask > 0, cols, 0.0), mask=col_mask)  # [B,M,G]
        tests_adv = (col_adv * tm[:, :, None]).sum(1) / jnp.maximum(n_tests, 1.0)[:, None]  # [B,G]
    else:
        frac = (jnp.where(tm[:, None, :] > 0, pt, 0.0)).sum(-1) / jnp.maximum(n_tests, 1.0)[:, None]  # [B,G]
        tests_adv = advantages(frac, mask=m)
    tests_adv = jnp.where(has_tests, tests_adv, 0.0) * m
    total = (w_outcome * outcome_adv + w_tests * tests_adv) * m
    return MultiScaleAdvantages(total=total, outcome=outcome_adv, tests=tests_adv)
