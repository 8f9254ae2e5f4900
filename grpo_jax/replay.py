"""Fixed-capacity prioritized replay with a functional sum tree (docs/GRPO_MATH.md §3 row 15).

Prioritized experience replay (Schaul et al. 2015, arXiv 1511.05952): item i is drawn with probability

    P(i) = p_i / Σ_j p_j

using a sum tree: a binary tree over C leaves (C = capacity rounded UP to a power of two) stored as a flat
array `tree[2C]`: node k has children 2k and 2k+1, the root is tree[1] = Σ p, leaf j (slot j) is tree[C + j],
tree[0] is unused (0). Slots >= capacity are padding leaves that stay 0 and are never sampled.

Replayed completions are off-policy: store the behaviour log-probs with them and use those in the ratio
(§3 row 15). What the seed called "replay successful trajectories" is `success_priority`.

All functions are pure and jit-safe; the state is a `flax.struct.dataclass` whose `capacity` is a static
(non-pytree) field, so `jax.jit(add)` needs no static arguments and orbax checkpoints the arrays:

    state = replay.init({"tokens": jnp.zeros((T,), jnp.int32), "logp": jnp.zeros((T,))}, capacity=1024)
    state = replay.add(state, items, replay.success_priority(reward, pass_rate), valid)   # items: [n, ...]
    idx, batch, prob = replay.sample(state, key, n)                                       # if total > 0
    state = replay.update_priorities(state, idx, new_priorities)

Shapes: n items per call; C tree leaves; `capacity` slots (the ring size, <= C).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class ReplayState:
    """Replay buffer state. Slots [0, size) hold written items (the ring fills 0, 1, ... then wraps)."""

    tree: jax.Array  # [2C] float32 sum tree; leaves (slot priorities) at [C, 2C); tree[1] = total
    data: Any  # pytree of arrays, each with leading axis `capacity` (NOT C: padding slots take no memory)
    size: jax.Array  # [] int32 number of written slots (<= capacity)
    next: jax.Array  # [] int32 ring write position (the oldest slot once full)
    capacity: int = flax.struct.field(pytree_node=False)

    @property
    def num_leaves(self) -> int:
        """C: capacity rounded up to a power of two."""
        return self.tree.shape[0] // 2


def _leaves_for(capacity: int) -> int:
    return 1 << (capacity - 1).bit_length()


def _depth(num_leaves: int) -> int:
    return num_leaves.bit_length() - 1  # log2(C)


def init(item_template: Any, capacity: int) -> ReplayState:
    """Empty buffer. item_template: pytree of arrays (or ShapeDtypeStructs) of ONE item, no leading axis."""
    capacity = int(capacity)
    if capacity < 1:
        raise ValueError(f"replay.init: capacity={capacity}: valid: an integer >= 1.")
    c = _leaves_for(capacity)
    data = jax.tree.map(lambda x: jnp.zeros((capacity, *jnp.shape(x)), x.dtype), item_template)
    return ReplayState(
        tree=jnp.zeros((2 * c,), jnp.float32),
        data=data,
        size=jnp.zeros((), jnp.int32),
        next=jnp.zeros((), jnp.int32),
        capacity=capacity,
    )


def _refresh(tree: jax.Array, slots: jax.Array, keep: jax.Array) -> jax.Array:
    """Recompute the ancestors of leaf `slots` (where `keep`) bottom-up: node = left child + right child.

    Each level is fully rewritten before the next, so duplicate parents get the same (correct) value, and
    every internal node is an exact float sum of its two children (no drift from incremental deltas).
    """
    c = tree.shape[0] // 2
    oob = 2 * c  # scatter index that mode="drop" discards
    node = jnp.where(keep, c + slots, oob)
    for _ in range(_depth(c)):
        node = jnp.where(keep, node // 2, oob)
        left = jnp.clip(2 * node, 0, 2 * c - 2)
        tree = tree.at[node].set(tree[left] + tree[left + 1], mode="drop")
    return tree


def _set_leaves(tree: jax.Array, slots: jax.Array, priorities: jax.Array, keep: jax.Array) -> jax.Array:
    c = tree.shape[0] // 2
    leaf = jnp.where(keep, c + slots, 2 * c)
    tree = tree.at[leaf].set(priorities, mode="drop")
    return _refresh(tree, slots, keep)


def _clean(priorities: jax.Array) -> jax.Array:
    """Priorities as float32 >= 0 (negative and NaN become 0: never sampled)."""
    p = jnp.asarray(priorities, jnp.float32)
    return jnp.where(p > 0, p, 0.0)


def add(state: ReplayState, items: Any, priorities: jax.Array, valid: jax.Array) -> ReplayState:
    """Write the valid items into the ring, overwriting the oldest slots.

    items: pytree matching the template, each leaf with leading axis n (n <= capacity, checked; static);
    priorities: [n] float32 (negative/NaN -> 0: stored but not sampled until update_priorities);
    valid: [n] bool. Valid item k goes to slot (next + #valid items before k) % capacity; invalid items
    are skipped (they take no slot). size and next advance by the number of valid items.
    """
    leaves = jax.tree.leaves(items)
    n = jnp.shape(priorities)[0]
    if n > state.capacity:
        raise ValueError(f"replay.add: {n} items exceed capacity={state.capacity}; add at most capacity.")
    for x in leaves:
        if jnp.shape(x)[:1] != (n,):
            raise ValueError(
                f"replay.add: every item leaf needs leading axis n={n}; got shape {jnp.shape(x)}."
            )
    v = jnp.asarray(valid).astype(bool)  # [n]
    chex.assert_shape([jnp.asarray(priorities), v], (n,))
    vi = v.astype(jnp.int32)
    offset = jnp.cumsum(vi) - vi  # [n] valid items before k
    slots = (state.next + offset) % state.capacity  # [n], distinct over valid k since #valid <= capacity
    write = jnp.where(v, slots, state.capacity)  # out of range -> dropped
    data = jax.tree.map(
        lambda buf, x: buf.at[write].set(jnp.asarray(x, buf.dtype), mode="drop"), state.data, items
    )
    tree = _set_leaves(state.tree, slots, _clean(priorities), v)
    n_valid = vi.sum()
    return dataclasses.replace(
        state,
        tree=tree,
        data=data,
        size=jnp.minimum(state.size + n_valid, state.capacity),
        next=(state.next + n_valid) % state.capacity,
    )


def total(state: ReplayState) -> jax.Array:
    """Σ priorities, [] float32 (the root)."""
    return state.tree[1]


def find(tree: jax.Array, values: jax.Array) -> jax.Array:
    """Leaf (slot) indices [n] int32 with prefix-sum interval containing `values` [n] (descent of the tree).

    Leaf j owns [Σ_{i<j} p_i, Σ_{i<=j} p_i); at each node go right iff value >= left sum, then subtract it.
    Round-off guard: never step into a child whose sum is 0, so when total > 0 the result is ALWAYS a leaf
    with priority > 0, whatever the value (values >= total land on the last positive leaf, negative values
    on the first). With total == 0 every value returns slot 0.
    E.g. priorities [1, 2, 3, 4], values [0.5, 1.5, 3.2, 9.9] -> [0, 1, 2, 3].
    """
    c = tree.shape[0] // 2
    v = jnp.maximum(jnp.asarray(values, jnp.float32), 0.0)
    node = jnp.ones(v.shape, jnp.int32)
    for _ in range(_depth(c)):
        left = 2 * node
        lsum, rsum = tree[left], tree[left + 1]
        # Right iff the value is past the left subtree (or the left is empty) AND the right is non-empty.
        go_right = ((v >= lsum) | (lsum <= 0)) & (rsum > 0)
        v = jnp.where(go_right, v - lsum, v)
        node = left + go_right.astype(jnp.int32)
    return node - c


def sample(state: ReplayState, key: jax.Array, n: int) -> tuple[jax.Array, Any, jax.Array]:
    """Stratified proportional sample of n slots (with replacement across strata): u_i = (i + U_i)/n · total.

    Returns idx [n] int32 slots, items (pytree, leading axis n), prob [n] float32 = priority/total (for
    importance weights (size·prob)^−β if wanted). Never returns a zero-priority or unwritten slot when
    total > 0. When total == 0 (empty buffer or all priorities 0) it returns idx = 0 and prob = 0 — the
    caller must check `total(state) > 0` first (e.g. gate the replay loss with it inside a jit).
    """
    tot = total(state)
    u = (jnp.arange(n, dtype=jnp.float32) + jax.random.uniform(key, (n,), jnp.float32)) / n * tot
    idx = find(state.tree, u)  # [n]
    pri = state.tree[state.num_leaves + idx]
    prob = jnp.where(tot > 0, pri / jnp.where(tot > 0, tot, 1.0), 0.0)
    safe = jnp.clip(idx, 0, state.capacity - 1)
    items = jax.tree.map(lambda buf: buf[safe], state.data)
    return idx, items, prob


def update_priorities(state: ReplayState, idx: jax.Array, priorities: jax.Array) -> ReplayState:
    """Set the priorities of slots idx [n] to priorities [n] (negative/NaN -> 0).

    Duplicate slots in idx: the LAST occurrence wins (deterministically — a stable sort picks it, since XLA
    does not order duplicate scatter writes). Slots outside the written range [0, size) are ignored, so an
    empty slot can never become sampleable.
    """
    idx = jnp.asarray(idx, jnp.int32)
    p = _clean(priorities)
    chex.assert_equal_shape([idx, p])
    if idx.shape[0] == 0:
        return state
    order = jnp.argsort(idx, stable=True)  # equal slots keep their call order
    s_idx, s_p = idx[order], p[order]
    last = jnp.concatenate([s_idx[1:] != s_idx[:-1], jnp.ones((1,), bool)])  # last of each run
    keep = last & (s_idx >= 0) & (s_idx < state.size)
    return dataclasses.replace(state, tree=_set_leaves(state.tree, s_idx, s_p, keep))


def success_priority(
    reward: jax.Array,
    pass_rate: jax.Array,
    *,
    threshold: float = 1.0,
    alpha: float = 1.0,
    eps: float = 0.01,
) -> jax.Array:
    """Priority for replaying successful trajectories (the seed's idea made precise, §3 row 15):

        p = (1 − s + eps)^alpha   if reward >= threshold     (s = pass rate of the problem, clipped to [0, 1])
        p = 0                     otherwise

    reward, pass_rate: [n] -> [n] float32. Successes on problems the policy rarely solves (s small) are
    replayed most; a problem it always solves (s = 1) keeps only eps^alpha. `pass_rate` is the caller's
    choice: the group's pass fraction or the curriculum's running s(q). alpha plays PER's α (0 = uniform over
    successes). E.g. reward [1, 1, 0, 1], s [0, 0.5, 0.2, 1], eps 0.01 -> [1.01, 0.51, 0, 0.01].
    """
    r = jnp.asarray(reward, jnp.float32)
    s = jnp.clip(jnp.asarray(pass_rate, jnp.float32), 0.0, 1.0)
    return jnp.where(r >= threshold, jnp.power(1.0 - s + eps, alpha), 0.0)
