"""Automatic curriculum over a fixed problem list (docs/GRPO_MATH.md §3 row 13).

Kimi k1.5 (arXiv 2501.12599, §2.3.2) samples problems by curriculum (easy levels first) and by priority
`P(q) ∝ 1 − s(q)`, s(q) the running success rate of problem q. This module keeps both signals as a pytree of
arrays (`CurriculumState`) so it can live inside the TrainState, be checkpointed by orbax and be updated
inside a jit:

    cfg = CurriculumConfig(kind="levels+pass_rate")
    state = curriculum.init(problem_levels, num_levels, cfg)          # problem_levels: np [N] int
    idx = curriculum.sample(state, cfg, levels, key, B)                   # [B] distinct problem ids
    ... roll out G completions per problem, grade them ...
    state = curriculum.update(state, cfg, levels, idx, passes, counts)   # passes [B] fraction, counts [B]

Shapes: N problems, L levels, B problems in a batch. `problem_levels` is [N] int32 with 0 <= level < L.

Running rates (per problem and per level) are exponential moving averages, updated ONCE per `update` call:

    s(q) ← ema·s(q) + (1 − ema)·ŝ(q)          ŝ(q) = Σ_b successes(b) / Σ_b counts(b) over the batch entries
                                               b with idx[b] = q  (duplicates are pooled, never applied twice)

* A problem never attempted (attempts == 0) has s(q) = `prior`; its first observation REPLACES the prior
  (s ← ŝ): the prior is only a placeholder for sampling, and one group of G samples is better evidence.
  This is the bias-corrected EMA for the first step (Adam-style debiasing of a zero-initialised EMA).
* Level rates follow the same rule per level, pooling all samples of the level in the batch. They RESTART at
  every change of `max_level`: `level_attempts` counts samples since the last change, and the first
  observation of a level after a change replaces its old rate. So a promotion/demotion decision only ever
  uses samples drawn under the current unlock state, and needs `min_attempts` of them.
* After the rates, at most one level change per update, on the highest unlocked level l = max_level:
      promote (l → l+1)  if level_attempts[l] >= min_attempts and level_rate[l] >= promote and l < L − 1
      demote  (l → l−1)  if level_attempts[l] >= min_attempts and level_rate[l] <  demote  and l > start_level
  `max_level` evolves for every `kind` (it is logged), but only the "levels" kinds use it for sampling.
* Entries with counts == 0 are ignored (padding rows of a batch).

Probabilities (`probabilities`):
    uniform           P(q) = 1/N
    levels            P(q) ∝ [level(q) <= max_level]
    pass_rate         P(q) ∝ max(1 − s(q), floor)
    levels+pass_rate  P(q) ∝ [level(q) <= max_level] · max(1 − s(q), floor)

The config's numbers are Python constants of the compiled function (configuration, not state): pass `cfg`
as a static argument, e.g. `jax.jit(update, static_argnums=1)`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.config import CurriculumConfig  # the curriculum section of the run config tree

# Sampling mass given to problems with probability 0 (locked levels) inside `sample`, so that asking for
# more problems than are unlocked still returns n distinct ids (see `sample`).
LOCKED_MASS = 1e-30


class CurriculumState(NamedTuple):
    """Curriculum state: a pytree of arrays (checkpointable, donatable)."""

    pass_rate: jax.Array  # [N] float32 running s(q)
    attempts: jax.Array  # [N] int32 samples seen per problem (ever)
    level_rate: jax.Array  # [L] float32 running pass rate per level (restarts after a change of max_level)
    level_attempts: jax.Array  # [L] int32 samples on each level since the last change of max_level
    max_level: jax.Array  # [] int32 highest unlocked level


def init(problem_levels, num_levels: int, cfg: CurriculumConfig) -> CurriculumState:
    """Initial state. problem_levels: [N] ints in [0, num_levels), every level holding >= 1 problem.

    Checked here (host side, concrete values): a level with no problems would stall promotion forever.
    """
    levels = np.asarray(problem_levels)
    if levels.ndim != 1 or levels.shape[0] == 0 or not np.issubdtype(levels.dtype, np.integer):
        raise ValueError(
            f"curriculum.init: problem_levels must be a non-empty 1-D integer array; got shape "
            f"{levels.shape} dtype {levels.dtype}."
        )
    num_levels = int(num_levels)
    if num_levels < 1 or levels.min() < 0 or levels.max() >= num_levels:
        raise ValueError(
            f"curriculum.init: problem levels must lie in [0, num_levels={num_levels}); got range "
            f"[{levels.min()}, {levels.max()}]."
        )
    empty = sorted(set(range(num_levels)) - set(levels.tolist()))
    if empty:
        raise ValueError(
            f"curriculum.init: levels {empty} hold no problems (num_levels={num_levels}); levels must be "
            "contiguous from 0, or promotion would stall on an empty level."
        )
    if cfg.start_level >= num_levels:
        raise ValueError(
            f"CurriculumConfig.start_level={cfg.start_level}: valid: 0 <= start_level < "
            f"num_levels={num_levels}."
        )
    n = levels.shape[0]
    return CurriculumState(
        pass_rate=jnp.full((n,), cfg.prior, jnp.float32),
        attempts=jnp.zeros((n,), jnp.int32),
        level_rate=jnp.full((num_levels,), cfg.prior, jnp.float32),
        level_attempts=jnp.zeros((num_levels,), jnp.int32),
        max_level=jnp.asarray(cfg.start_level, jnp.int32),
    )


def _ema(old, obs, seen_before, observed, ema):
    """EMA step where `observed`; the first observation (not seen_before) replaces the old value."""
    new = jnp.where(seen_before, ema * old + (1.0 - ema) * obs, obs)
    return jnp.where(observed, new, old)


def update(
    state: CurriculumState,
    cfg: CurriculumConfig,
    problem_levels: jax.Array,
    idx: jax.Array,
    passes: jax.Array,
    counts: jax.Array,
) -> CurriculumState:
    """Fold one batch of graded rollouts into the state (module docstring: EMA, first observation, levels).

    problem_levels: [N] int32; idx: [B] int32 problem ids (duplicates allowed: pooled by sample count);
    passes: [B] float32 fraction of the counts[b] samples of problem idx[b] that passed; counts: [B] int32
    samples (0 = padding row, ignored). Pure and jit-safe (cfg static). Returns the new state.
    """
    levels = jnp.asarray(problem_levels, jnp.int32)  # [N]
    idx = jnp.asarray(idx, jnp.int32)  # [B]
    cnt_i = jnp.maximum(jnp.asarray(counts, jnp.int32), 0)  # [B]
    cnt = cnt_i.astype(jnp.float32)
    succ = jnp.asarray(passes, jnp.float32) * cnt  # [B] successes
    n_problems = state.pass_rate.shape[0]
    n_levels = state.level_rate.shape[0]

    # Per problem: pool the batch's samples of each problem (segment sums handle duplicate ids).
    p_succ = jnp.zeros((n_problems,), jnp.float32).at[idx].add(succ)
    p_cnt = jnp.zeros((n_problems,), jnp.int32).at[idx].add(cnt_i)
    p_obs = p_succ / jnp.maximum(p_cnt, 1).astype(jnp.float32)
    pass_rate = _ema(state.pass_rate, p_obs, state.attempts > 0, p_cnt > 0, cfg.ema)
    attempts = state.attempts + p_cnt

    # Per level: pool the batch's samples of each level.
    lvl = levels[idx]  # [B]
    l_succ = jnp.zeros((n_levels,), jnp.float32).at[lvl].add(succ)
    l_cnt = jnp.zeros((n_levels,), jnp.int32).at[lvl].add(cnt_i)
    l_obs = l_succ / jnp.maximum(l_cnt, 1).astype(jnp.float32)
    level_rate = _ema(state.level_rate, l_obs, state.level_attempts > 0, l_cnt > 0, cfg.ema)
    level_attempts = state.level_attempts + l_cnt

    # Promotion / demotion of the highest unlocked level (at most one change; demote < promote).
    top = state.max_level
    top_rate = level_rate[top]
    trusted = level_attempts[top] >= cfg.min_attempts
    up = trusted & (top_rate >= cfg.promote) & (top < n_levels - 1)
    down = trusted & (top_rate < cfg.demote) & (top > cfg.start_level)
    max_level = top + up.astype(jnp.int32) - down.astype(jnp.int32)
    level_attempts = jnp.where(up | down, jnp.zeros_like(level_attempts), level_attempts)

    return CurriculumState(
        pass_rate=pass_rate,
        attempts=attempts,
        level_rate=level_rate,
        level_attempts=level_attempts,
        max_level=max_level,
    )


def probabilities(state: CurriculumState, cfg: CurriculumConfig, problem_levels: jax.Array) -> jax.Array:
    """Sampling distribution over problems, [N] float32 summing to 1 (formulas in the module docstring).

    Never all-zero: floor > 0, and level 0..start_level always hold problems (checked by `init`).
    """
    levels = jnp.asarray(problem_levels, jnp.int32)  # [N]
    w = jnp.ones(state.pass_rate.shape, jnp.float32)
    if cfg.uses_pass_rate:
        w = jnp.maximum(1.0 - state.pass_rate, cfg.floor)
    if cfg.uses_levels:
        w = jnp.where(levels <= state.max_level, w, 0.0)
    return w / w.sum()


def sample(
    state: CurriculumState, cfg: CurriculumConfig, problem_levels: jax.Array, key: jax.Array, n: int
) -> jax.Array:
    """n distinct problem ids, [n] int32: jax.random.choice(key, N, (n,), replace=False, p=probabilities).

    Fallback when fewer than n problems have probability > 0 (a small unlocked set): zero-probability
    (locked) problems get mass LOCKED_MASS = 1e-30. Under the Gumbel top-k sampler of `choice` every
    positive-probability problem then outranks every locked one (log-gap > 50 nats vs a Gumbel range of
    ~20 in float32), so all unlocked problems are returned first and the rest are locked problems drawn
    uniformly at random. The call never fails for n <= N (n > N raises ValueError, n is static).
    Deterministic for a fixed key.
    """
    n_problems = state.pass_rate.shape[0]
    if not 0 <= n <= n_problems:
        raise ValueError(
            f"curriculum.sample: n={n} must be in [0, N={n_problems}] (sampling w/o replacement)."
        )
    p = probabilities(state, cfg, problem_levels)
    p = jnp.where(p > 0, p, LOCKED_MASS)
    return jax.random.choice(key, n_problems, (n,), replace=False, p=p).astype(jnp.int32)


def level_rates(state: CurriculumState) -> dict[str, jax.Array]:
    """Flat scalar metrics for logging: curriculum/level{l}_pass_rate for each level, curriculum/max_level."""
    out = {f"curriculum/level{lv}_pass_rate": state.level_rate[lv] for lv in range(state.level_rate.shape[0])}
    out["curriculum/max_level"] = state.max_level
    return out
