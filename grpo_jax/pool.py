"""The seed's pool of past policies: K snapshots kept as ONE stacked pytree and evaluated under `vmap`.

    pool = init(params, capacity=32)                       # every leaf gets a leading axis of 32 slots
    pool = push(pool, params, step=10, explore=..., ...)   # ring buffer: overwrites the oldest slot
    active = active_mask(pool, k)                          # the k most recent snapshots (k is DATA)
    idx, m = select_members(pool, k, key, 8)               # 8 slots to evaluate this step (+ validity mask)
    logp = member_logp(member_fn, gather(pool.params, idx), prompt, pmask, completions)  # [8, B, G, T]

Layout: `params` holds `capacity` (K_max, static) slots along a new leading axis; `valid` marks written slots,
`push_index` numbers the pushes (the recency order), `pushed_at` is the training step of each snapshot (ages)
and `explore` flags exploration members. The active size K is an array argument, so a K schedule
(8 -> 16 -> 32) never recompiles: the active set is simply the K most recent valid slots.

What a slot holds is the caller's choice: the full parameters, or only LoRA adapters (then the pool costs
K x adapter size, and the members are evaluated together on one copy of the frozen base:
`lora_member_logp`, `make_member_sampler(lora_alpha=...)`; grpo_jax.policies.lora.merge_members).

The pool is a baseline, not the GRPO group (docs/GRPO_MATH.md §3 rows 2 and 4): the group stays G
completions of the
current policy; `returns_baseline` turns the pool members' rewards on the SAME prompts into a per-prompt
baseline b_pool(q), which grpo_jax.core.advantages.scaled_baseline uses without re-centring (a z-score would
cancel it, T1b). Exploration members (row 16) sample at a higher temperature or carry parameter noise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from grpo_jax.policies import lora, sampling


@flax.struct.dataclass
class PoolState:
    params: Any  # pytree, every leaf [C, ...] (C = capacity)
    valid: jax.Array  # [C] bool: the slot holds a snapshot
    push_index: jax.Array  # [C] int32: number of the push that wrote the slot (-1: never written)
    pushed_at: jax.Array  # [C] int32: training step of the snapshot (-1: never written)
    explore: jax.Array  # [C] bool: exploration member
    pushes: jax.Array  # [] int32: pushes so far (the next slot is pushes % C)

    @property
    def capacity(self) -> int:
        return int(self.valid.shape[0])


def init(template: Any, capacity: int) -> PoolState:
    """An empty pool of `capacity` slots shaped like `template` (full params or LoRA adapters)."""
    if capacity < 1:
        raise ValueError(f"pool capacity={capacity}: must be >= 1")
    stacked = jax.tree.map(lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), template)
    return PoolState(
        params=stacked,
        valid=jnp.zeros((capacity,), bool),
        push_index=jnp.full((capacity,), -1, jnp.int32),
        pushed_at=jnp.full((capacity,), -1, jnp.int32),
        explore=jnp.zeros((capacity,), bool),
        pushes=jnp.int32(0),
    )


def is_exploration_push(n: jax.Array, fraction: float) -> jax.Array:
    """Whether push number n (0-based) makes an exploration member: floor((n+1)f) > floor(n f).

    Spreads exactly round-down(N f) exploration members evenly over any N consecutive pushes from 0; f=0.2
    gives pushes 4, 9, 14, ... (one in five)."""
    n = jnp.asarray(n, jnp.float32)
    return jnp.floor((n + 1.0) * fraction + 1e-6) > jnp.floor(n * fraction + 1e-6)


def param_noise(snapshot: Any, key: jax.Array, scale: float) -> Any:
    """snapshot + scale · RMS(leaf) · N(0, 1) per floating leaf (relative Gaussian parameter noise)."""
    leaves, treedef = jax.tree.flatten(snapshot)
    keys = jax.random.split(key, max(len(leaves), 1))
    out = []
    for x, k in zip(leaves, keys, strict=False):
        x32 = jnp.asarray(x, jnp.float32)
        rms = jnp.sqrt(jnp.mean(jnp.square(x32)))
        out.append((x32 + scale * rms * jax.random.normal(k, x32.shape, jnp.float32)).astype(x.dtype))
    return jax.tree.unflatten(treedef, out)


def push(
    pool: PoolState,
    snapshot: Any,
    step: jax.Array,
    *,
    explore_fraction: float = 0.0,
    noise: float = 0.0,
    key: jax.Array | None = None,
) -> PoolState:
    """Write `snapshot` into the oldest slot (ring buffer). jit-safe; jit it with the pool donated.

    With explore_fraction > 0 some pushes become exploration members (`is_exploration_push`); with noise > 0
    (and a key) an exploration member is stored with relative parameter noise of that size."""
    c = pool.capacity
    n = pool.pushes
    slot = n % c
    explore = is_exploration_push(n, explore_fraction) if explore_fraction > 0 else jnp.bool_(False)
    if noise > 0:
        if key is None:
            raise ValueError("pool.push: parameter noise needs a key")
        noisy = param_noise(snapshot, key, noise)
        snapshot = jax.tree.map(lambda a, b: jnp.where(explore, a, b), noisy, snapshot)

    def write(buf, x):
        return jax.lax.dynamic_update_index_in_dim(buf, jnp.asarray(x, buf.dtype), slot, 0)

    return dataclasses.replace(
        pool,
        params=jax.tree.map(write, pool.params, snapshot),
        valid=pool.valid.at[slot].set(True),
        push_index=pool.push_index.at[slot].set(n),
        pushed_at=pool.pushed_at.at[slot].set(jnp.asarray(step, jnp.int32)),
        explore=pool.explore.at[slot].set(explore),
        pushes=n + 1,
    )


def recency(pool: PoolState) -> jax.Array:
    """[C] int32: 0 for the newest snapshot, 1 for the one before, ...; a large number for empty slots."""
    return jnp.where(pool.valid, pool.pushes - 1 - pool.push_index, jnp.iinfo(jnp.int32).max)


def active_mask(pool: PoolState, k: jax.Array) -> jax.Array:
    """[C] bool: the `k` most recent valid snapshots (k is an array: changing it does not recompile)."""
    return pool.valid & (recency(pool) < jnp.asarray(k, jnp.int32))


def ages(pool: PoolState, step: jax.Array) -> jax.Array:
    """[C] int32: training steps since each snapshot was taken (-1 for empty slots)."""
    return jnp.where(pool.valid, jnp.asarray(step, jnp.int32) - pool.pushed_at, -1)


def select_members(pool: PoolState, k: jax.Array, key: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
    """`m` (static) slots to evaluate: a uniformly random subset of the active ones, then inactive ones.

    Returns (idx [m] int32, mask [m] bool: the slot is active). With m = capacity every active slot is
    selected. Shapes are static whatever k is, so the evaluation compiles once."""
    active = active_mask(pool, k)
    u = jax.random.uniform(key, active.shape)
    order = jnp.argsort(jnp.where(active, u, 1.0 + u))  # active slots first, in random order
    idx = order[:m].astype(jnp.int32)
    return idx, active[idx]


def gather(stacked: Any, idx: jax.Array) -> Any:
    """The members `idx` of a stacked pytree (leading axis len(idx))."""
    return jax.tree.map(lambda x: jnp.take(x, idx, axis=0), stacked)


def member_logp(logp_fn: Callable[..., jax.Array], members: Any, *args: Any) -> jax.Array:
    """vmap of `logp_fn(member_params, *args)` over the members' leading axis (args are shared)."""
    return jax.vmap(lambda p: logp_fn(p, *args))(members)


def loop_logp(logp_fn: Callable[..., jax.Array], members: Any, *args: Any) -> jax.Array:
    """The same as `member_logp` with a Python loop over members (the reference the vmap is tested against
    and the baseline of the pool benchmark)."""
    n = jax.tree.leaves(members)[0].shape[0]
    return jnp.stack([logp_fn(jax.tree.map(lambda x, i=i: x[i], members), *args) for i in range(n)])


def member_temperatures(
    pool: PoolState, idx: jax.Array, base: float, explore_temperature: float, use_explore: bool
) -> jax.Array:
    """[m] sampling temperature of each selected member: exploration members use `explore_temperature`."""
    t = jnp.full(idx.shape, base, jnp.float32)
    if use_explore:
        t = jnp.where(pool.explore[idx], jnp.float32(explore_temperature), t)
    return t


def lora_member_logp(
    logp_fn: Callable[..., jax.Array], base: Any, adapters: Any, alpha: float, prompt, pmask, completions
) -> jax.Array:
    """`member_logp` for M LoRA members of one base (adapters stacked [M, ...]) WITHOUT vmap: the members'
    copies of the batch are one member-major batch of M*B rows (`lora.merge_members`), so each projection is
    one base matmul plus per-member rank-r deltas. logp_fn(params, prompt, pmask, completions [B, G, T])
    -> [B, G, T]. Returns [M, B, G, T]."""
    m = lora.num_members(adapters)
    b = prompt.shape[0]
    params = lora.merge_members(base, adapters, alpha=alpha)
    tile = lambda x: jnp.tile(x, (m,) + (1,) * (x.ndim - 1))  # noqa: E731
    out = logp_fn(params, tile(prompt), tile(pmask), tile(completions))
    return out.reshape(m, b, *out.shape[1:])


def make_member_sampler(
    model_cfg,
    *,
    group: int,
    max_new: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
    lora_alpha: float | None = None,
):
    """The jitted sampler of selected pool slots:

        fn(stacked, idx [m], base, prompt [B, P], pmask, keys [m], temperatures [m], top_k, top_p)
            -> SampleOutput with a leading member axis [m, B, group, T]

    The members are gathered from the stacked pool inside the jit. Full-parameter slots (lora_alpha None,
    `base` unused): `sampling.sample_members`, vmapped over members. LoRA-adapter slots (lora_alpha = the
    run's alpha, `base` = the frozen base parameters): `sampling.sample_lora_members`, one batch of m*B rows
    on the shared base (one base matmul per projection for every member, per-member low-rank deltas)."""

    def fn(stacked, idx, base, prompt, pmask, keys, temperatures, top_k, top_p):
        sp = sampling.SamplingParams(temperatures, top_k, top_p)
        kw = dict(group=group, max_new=max_new, eos_id=eos_id, pad_id=pad_id)
        members = gather(stacked, idx)
        if lora_alpha is not None:
            return sampling.sample_lora_members(
                base, members, lora_alpha, model_cfg, prompt, pmask, keys, sp, **kw
            )
        return sampling.sample_members(members, model_cfg, prompt, pmask, keys, sp, **kw)

    return jax.jit(fn)


def returns_baseline(rewards: jax.Array, member_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-prompt pool baseline from the members' rewards on the same prompts.

    rewards: [m, B, g] (g samples per member and prompt; non-finite entries are ignored); member_mask [m].
    Returns (b_pool [B] = mean over valid members and samples, has [B] bool: at least one valid return)."""
    r = jnp.asarray(rewards, jnp.float32)
    w = jnp.broadcast_to(jnp.asarray(member_mask, jnp.float32)[:, None, None], r.shape)
    w = w * jnp.isfinite(r)
    n = w.sum((0, 2))
    b = jnp.where(w > 0, r, 0.0).sum((0, 2)) / jnp.maximum(n, 1.0)
    return b, n > 0


def diversity(pool: PoolState, k: jax.Array) -> jax.Array:
    """Relative parameter-space spread of the active members:

        D = mean_{i≠j} ||θ_i − θ_j||² / mean_i ||θ_i||²
          = 2n/(n−1) · (mean_i ||θ_i||² − ||θ̄||²) / mean_i ||θ_i||²

    0 when fewer than 2 members are active or all are identical."""
    a = active_mask(pool, k).astype(jnp.float32)
    n = a.sum()
    sq = jnp.float32(0.0)
    mean_sq = jnp.float32(0.0)
    for x in jax.tree.leaves(pool.params):
        x = x.reshape(x.shape[0], -1).astype(jnp.float32)
        sq = sq + jnp.sum(a * jnp.sum(jnp.square(x), axis=1)) / jnp.maximum(n, 1.0)
        mean = jnp.sum(a[:, None] * x, axis=0) / jnp.maximum(n, 1.0)
        mean_sq = mean_sq + jnp.sum(jnp.square(mean))
    pair = 2.0 * n / jnp.maximum(n - 1.0, 1.0) * jnp.maximum(sq - mean_sq, 0.0)
    return jnp.where(n >= 2, pair / jnp.maximum(sq, 1e-30), 0.0)
