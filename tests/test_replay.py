"""Tests for grpo_jax.replay (prioritized replay, sum tree; docs/GRPO_MATH.md §3 row 15) with literal
values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import replay as R

ATOL = 1e-6

# Jitted once per shape (eager op-by-op dispatch is slower on this 2-core machine); test_jit_matches_eager
# checks these against the eager functions.
ADD = jax.jit(R.add)
SAMPLE = jax.jit(R.sample, static_argnums=2)
FIND = jax.jit(R.find)
UPDATE = jax.jit(R.update_priorities)


def _template():
    return {"id": jnp.zeros((), jnp.int32), "tokens": jnp.zeros((3,), jnp.int32)}


def _items(ids):
    ids = jnp.asarray(ids, jnp.int32)
    return {"id": ids, "tokens": jnp.stack([ids, ids + 100, ids + 200], axis=1)}  # [n], [n, 3]


def _add(state, ids, priorities, valid=None):
    n = len(ids)
    valid = jnp.ones((n,), bool) if valid is None else jnp.asarray(valid)
    return ADD(state, _items(ids), jnp.asarray(priorities, jnp.float32), valid)


def _filled(priorities, capacity=None):
    s = R.init(_template(), capacity or len(priorities))
    return _add(s, list(range(len(priorities))), priorities)


# ------------------------------------------------------------------------------------------------------------
# init / add / tree sums
# ------------------------------------------------------------------------------------------------------------


def test_init_shapes():
    s = R.init(_template(), 5)
    assert s.capacity == 5 and s.num_leaves == 8
    assert s.tree.shape == (16,) and s.tree.dtype == jnp.float32
    assert s.data["id"].shape == (5,) and s.data["tokens"].shape == (5, 3)
    assert s.data["tokens"].dtype == jnp.int32
    assert int(s.size) == 0 and int(s.next) == 0 and float(R.total(s)) == 0.0
    assert R.init(_template(), 1).tree.shape == (2,)
    with pytest.raises(ValueError, match="capacity=0"):
        R.init(_template(), 0)


def test_tree_sums_capacity_4():
    s = _filled([1.0, 2.0, 3.0, 4.0])
    # [unused, root, internal (1+2, 3+4), leaves]
    np.testing.assert_array_equal(s.tree, [0, 10, 3, 7, 1, 2, 3, 4])
    assert float(R.total(s)) == 10.0
    assert int(s.size) == 4 and int(s.next) == 0
    np.testing.assert_array_equal(s.data["id"], [0, 1, 2, 3])
    np.testing.assert_array_equal(s.data["tokens"][2], [2, 102, 202])


def test_capacity_5_rounds_to_8_and_padding_stays_zero():
    s = _filled([1.0, 2.0, 3.0, 4.0, 5.0])
    # leaves [1,2,3,4,5,0,0,0]; level 2: [3,7,5,0]; level 1: [10,5]; root 15.
    np.testing.assert_array_equal(s.tree, [0, 15, 10, 5, 3, 7, 5, 0, 1, 2, 3, 4, 5, 0, 0, 0])
    s = _add(s, [5, 6], [6.0, 7.0])  # wraps at 5, not at 8: slots 0, 1
    np.testing.assert_array_equal(s.tree[8:], [6, 7, 3, 4, 5, 0, 0, 0])
    assert float(R.total(s)) == 25.0 and int(s.next) == 2 and int(s.size) == 5


def test_ring_overwrite_order():
    s = R.init(_template(), 4)
    add = ADD
    for i in range(6):  # capacity + 2 single adds: items 4, 5 overwrite the oldest (0, 1)
        s = add(s, _items([i]), jnp.array([i + 1.0]), jnp.array([True]))
    np.testing.assert_array_equal(s.data["id"], [4, 5, 2, 3])
    np.testing.assert_array_equal(s.data["tokens"][:, 1], [104, 105, 102, 103])
    np.testing.assert_array_equal(s.tree[4:], [5, 6, 3, 4])
    np.testing.assert_array_equal(s.tree[1:4], [18, 11, 7])
    assert int(s.size) == 4 and int(s.next) == 2
    # The same in two batched adds, one of which wraps.
    t = _add(_add(R.init(_template(), 4), [0, 1, 2], [1.0, 2.0, 3.0]), [3, 4, 5], [4.0, 5.0, 6.0])
    np.testing.assert_array_equal(t.data["id"], [4, 5, 2, 3])
    np.testing.assert_array_equal(t.tree, s.tree)
    assert int(t.next) == 2


def test_invalid_items_skipped():
    s = R.init(_template(), 4)
    s = _add(s, [10, 11, 12, 13], [1.0, 2.0, 3.0, 4.0], [True, False, True, False])
    np.testing.assert_array_equal(s.data["id"], [10, 12, 0, 0])
    np.testing.assert_array_equal(s.tree, [0, 4, 4, 0, 1, 3, 0, 0])
    assert int(s.size) == 2 and int(s.next) == 2
    s = _add(s, [20, 21, 22], [5.0, 6.0, 7.0], [False, True, True])
    np.testing.assert_array_equal(s.data["id"], [10, 12, 21, 22])
    np.testing.assert_array_equal(s.tree, [0, 17, 4, 13, 1, 3, 6, 7])
    assert int(s.size) == 4 and int(s.next) == 0
    s = _add(s, [30], [9.0], [False])  # nothing valid: unchanged
    np.testing.assert_array_equal(s.tree, [0, 17, 4, 13, 1, 3, 6, 7])
    assert int(s.next) == 0


def test_add_checks_and_negative_priorities():
    s = R.init(_template(), 2)
    with pytest.raises(ValueError, match="exceed capacity=2"):
        _add(s, [0, 1, 2], [1.0, 1.0, 1.0])
    s = _add(s, [0, 1], [-3.0, float("nan")])  # stored, priority 0
    np.testing.assert_array_equal(s.tree, [0, 0, 0, 0])
    assert int(s.size) == 2


# ------------------------------------------------------------------------------------------------------------
# update_priorities
# ------------------------------------------------------------------------------------------------------------


def test_update_priorities_exact_sums():
    s = _filled([1.0, 2.0, 3.0, 4.0])
    s = UPDATE(s, jnp.array([1, 3]), jnp.array([0.5, 10.0]))
    # leaves [1, 0.5, 3, 10]; internal [1.5, 13]; root 14.5.
    np.testing.assert_array_equal(s.tree, [0, 14.5, 1.5, 13, 1, 0.5, 3, 10])


def test_update_priorities_duplicates_last_wins():
    s = _filled([1.0, 2.0, 3.0, 4.0])
    s = R.update_priorities(s, jnp.array([2, 0, 2, 2, 0]), jnp.array([7.0, 5.0, 8.0, 9.0, 0.0]))
    # slot 2: 7, 8, then 9 -> 9; slot 0: 5 then 0 -> 0.
    np.testing.assert_array_equal(s.tree, [0, 15, 2, 13, 0, 2, 9, 4])
    jitted = jax.jit(R.update_priorities)(_filled([1.0, 2.0, 3.0, 4.0]), jnp.array([2, 0, 2, 2, 0]),
                                          jnp.array([7.0, 5.0, 8.0, 9.0, 0.0]))  # fmt: skip
    np.testing.assert_array_equal(jitted.tree, s.tree)


def test_update_priorities_ignores_unwritten_slots():
    s = _add(R.init(_template(), 5), [0, 1], [1.0, 2.0])  # size 2 of capacity 5 (C = 8)
    t = UPDATE(s, jnp.array([1, 2, 4, 6, -1]), jnp.array([3.0, 9.0, 9.0, 9.0, 9.0]))
    np.testing.assert_array_equal(t.tree[8:], [1, 3, 0, 0, 0, 0, 0, 0])
    assert float(R.total(t)) == 4.0


# ------------------------------------------------------------------------------------------------------------
# find / sample
# ------------------------------------------------------------------------------------------------------------


def test_find_literal():
    tree = _filled([1.0, 2.0, 3.0, 4.0]).tree  # prefix intervals [0,1) [1,3) [3,6) [6,10)
    np.testing.assert_array_equal(FIND(tree, jnp.array([0.5, 1.5, 3.2, 9.9])), [0, 1, 2, 3])
    np.testing.assert_array_equal(FIND(tree, jnp.array([0.0, 1.0, 3.0, 6.0])), [0, 1, 2, 3])  # left edges
    # Out of range (round-off at the right edge, or worse) -> last / first positive leaf.
    np.testing.assert_array_equal(FIND(tree, jnp.array([10.0, 1e9, -1.0])), [3, 3, 0])


def test_find_skips_zero_leaves():
    tree = _filled([0.0, 2.0, 0.0, 4.0]).tree  # intervals: slot 1 [0,2), slot 3 [2,6)
    np.testing.assert_array_equal(FIND(tree, jnp.array([0.0, 1.99, 2.0, 5.9, 6.0, 7.0])), [1, 1, 3, 3, 3, 3])
    tree = _filled([1.0, 2.0, 0.0, 0.0]).tree  # right subtree empty: values >= 3 stay on slot 1
    np.testing.assert_array_equal(FIND(tree, jnp.array([2.999, 3.0, 3.5])), [1, 1, 1])
    tree = _filled([1.0, 2.0, 3.0], capacity=3).tree  # padding leaf 3 (C = 4) is never reached
    np.testing.assert_array_equal(FIND(tree, jnp.array([5.99, 6.0, 100.0])), [2, 2, 2])
    # A right-edge value one ulp above the sum of a left subtree whose right sibling is empty.
    tree = _filled([0.1, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3]).tree
    v = jnp.nextafter(tree[1], jnp.float32(jnp.inf))
    assert int(FIND(tree, v[None])[0]) == 7


def test_zero_priority_slots_never_sampled():
    s = _filled([0.0, 1.0, 0.0, 3.0, 0.0], capacity=5)
    seen = set()
    for seed in range(10):
        idx, items, prob = SAMPLE(s, jax.random.key(seed), 500)
        seen |= set(np.asarray(idx).tolist())
        np.testing.assert_array_equal(items["id"], idx)  # items come from the sampled slots
    assert seen == {1, 3}


def test_sample_frequencies_and_prob():
    s = _filled([1.0, 2.0, 3.0, 4.0])
    draws = 4000
    idx, items, prob = SAMPLE(s, jax.random.key(0), draws)
    assert idx.dtype == jnp.int32 and idx.shape == (draws,) and items["tokens"].shape == (draws, 3)
    np.testing.assert_allclose(prob, (np.asarray(idx) + 1.0) / 10.0, atol=ATOL)  # priority / total
    p = np.array([0.1, 0.2, 0.3, 0.4])
    freq = np.bincount(np.asarray(idx), minlength=4) / draws
    # Stratified sampling has LESS variance than multinomial, so the multinomial 3-sigma bound is safe.
    assert np.all(np.abs(freq - p) <= 3 * np.sqrt(p * (1 - p) / draws)), freq
    chi2 = float(np.sum((freq * draws - p * draws) ** 2 / (p * draws)))
    assert chi2 < 16.27  # chi-square, 3 dof, p = 0.001


def test_sample_stratified_covers_each_stratum():
    s = _filled([1.0, 1.0, 1.0, 1.0])
    idx, _, _ = SAMPLE(s, jax.random.key(3), 4)  # one uniform per quarter of [0, 4) -> one per slot
    np.testing.assert_array_equal(idx, [0, 1, 2, 3])


def test_sample_empty_buffer():
    s = R.init(_template(), 4)
    idx, items, prob = SAMPLE(s, jax.random.key(0), 3)
    np.testing.assert_array_equal(idx, [0, 0, 0])
    np.testing.assert_array_equal(prob, [0.0, 0.0, 0.0])
    assert np.all(np.isfinite(prob))


def test_jit_matches_eager():
    s = R.init(_template(), 5)
    traces = []

    def counted_add(*args):
        traces.append(1)  # runs once per trace
        return R.add(*args)

    add = jax.jit(counted_add)
    sample = jax.jit(R.sample, static_argnums=2)
    ids, pri, valid = [0, 1, 2, 3], jnp.array([1.0, 0.0, 2.5, 4.0]), jnp.array([True, True, False, True])
    eager = R.add(s, _items(ids), pri, valid)
    jitted = add(s, _items(ids), pri, valid)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_array_equal(a, b)
    assert jitted.capacity == 5
    key = jax.random.key(11)
    for a, b in zip(
        jax.tree.leaves(R.sample(eager, key, 8)), jax.tree.leaves(sample(eager, key, 8)), strict=True
    ):
        np.testing.assert_allclose(a, b, atol=ATOL)
    # A second add with the same shapes (the jitted output state) does not retrace.
    add(jitted, _items(ids), pri, valid)
    assert len(traces) == 1


# ------------------------------------------------------------------------------------------------------------
# success_priority
# ------------------------------------------------------------------------------------------------------------


def test_success_priority_literal():
    r = jnp.array([1.0, 1.0, 0.0, 1.0, 0.99])
    s = jnp.array([0.0, 0.5, 0.2, 1.0, 0.0])
    np.testing.assert_allclose(R.success_priority(r, s), [1.01, 0.51, 0.0, 0.01, 0.0], atol=ATOL)
    np.testing.assert_allclose(
        R.success_priority(r, s, alpha=2.0), [1.0201, 0.2601, 0.0, 0.0001, 0.0], atol=ATOL
    )
    # threshold 0.5: reward 0.99 counts; eps 0: a problem always solved gets 0.
    np.testing.assert_allclose(
        R.success_priority(r, s, threshold=0.5, eps=0.0), [1.0, 0.5, 0.0, 0.0, 1.0], atol=ATOL
    )
