"""Toy tasks in pure JAX, deterministic by seed/key, sized for CPU learning tests.

* ``DiscreteBandit`` — a contextual bandit with a sparse +1/0 reward, like the code task's all-pass reward:
  ``obs ~ N(0, I_d)``, ``r(obs, a) = 1[a == argmax_j (W obs)_j]`` for a hidden ``W [A, d]``. Chance = 1/A.
* ``ContinuousBandit`` — ``obs ~ N(0, I_d)``, ``r(obs, a) = exp(−||a − M obs||² / A)`` in (0, 1] for a hidden
  ``M [A, d]`` with entries ``N(0, 1/d)`` (so the target ``M obs`` is roughly ``N(0, I_A)``).
* ``Chain`` — a short episodic 1-D chain for PPO/GAE: positions ``0..n-1``, start uniform in ``0..n-3``,
  actions 0 = left, 1 = right (walls at both ends), reward +1 on reaching ``n-1`` (the episode then ends),
  0 otherwise; the episode is cut at ``horizon`` steps. Observation: one-hot position and ``t / horizon``
  (so the truncated task is Markov). Sparse and terminal: the critic and GAE have credit to assign.

A bandit is a one-step task: "prompts" are observations, "completions" are single actions (T = 1).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array


# ----------------------------------------------------------------------------------------------------------
# bandits


@struct.dataclass
class DiscreteBandit:
    """Contextual bandit with reward ``1[a == argmax(W obs)]``."""

    W: Array  # [A, d]

    @property
    def obs_dim(self) -> int:
        return self.W.shape[1]

    @property
    def act_dim(self) -> int:
        return self.W.shape[0]

    @property
    def chance(self) -> float:
        """Success rate of the uniform policy."""
        return 1.0 / self.act_dim

    def observe(self, key: Array, batch_shape: tuple[int, ...]) -> Array:
        """``obs ~ N(0, I_d)``, shape ``[*batch_shape, d]``."""
        return jax.random.normal(key, (*batch_shape, self.obs_dim), jnp.float32)

    def optimal_action(self, obs: Array) -> Array:
        """``argmax_j (W obs)_j``, int32 ``[...]``."""
        return jnp.argmax(obs @ self.W.T, axis=-1).astype(jnp.int32)

    def reward(self, obs: Array, action: Array) -> Array:
        """``1[action == argmax(W obs)]`` as float32 ``[...]``."""
        return (action == self.optimal_action(obs)).astype(jnp.float32)


def make_discrete_bandit(seed: int, obs_dim: int, act_dim: int) -> DiscreteBandit:
    """A fixed hidden ``W`` drawn from ``seed``."""
    if act_dim < 2 or obs_dim < 1:
        raise ValueError(f"need act_dim >= 2 and obs_dim >= 1, got act_dim={act_dim}, obs_dim={obs_dim}.")
    return DiscreteBandit(W=jax.random.normal(jax.random.key(seed), (act_dim, obs_dim), jnp.float32))


@struct.dataclass
class ContinuousBandit:
    """Contextual bandit with reward ``exp(−||a − M obs||² / A)``."""

    M: Array  # [A, d]

    @property
    def obs_dim(self) -> int:
        return self.M.shape[1]

    @property
    def act_dim(self) -> int:
        return self.M.shape[0]

    def observe(self, key: Array, batch_shape: tuple[int, ...]) -> Array:
        """``obs ~ N(0, I_d)``, shape ``[*batch_shape, d]``."""
        return jax.random.normal(key, (*batch_shape, self.obs_dim), jnp.float32)

    def optimal_action(self, obs: Array) -> Array:
        """``M obs``, float32 ``[..., A]`` (reward 1)."""
        return obs @ self.M.T

    def reward(self, obs: Array, action: Array) -> Array:
        """``exp(−||action − M obs||² / A)``, float32 ``[...]`` in (0, 1]."""
        sq = jnp.sum((action - self.optimal_action(obs)) ** 2, axis=-1)
        return jnp.exp(-sq / self.act_dim)


def make_continuous_bandit(seed: int, obs_dim: int, act_dim: int) -> ContinuousBandit:
    """A fixed hidden ``M`` with entries ``N(0, 1/obs_dim)`` drawn from ``seed``."""
    if act_dim < 1 or obs_dim < 1:
        raise ValueError(f"need act_dim >= 1 and obs_dim >= 1, got act_dim={act_dim}, obs_dim={obs_dim}.")
    m = jax.random.normal(jax.random.key(seed), (act_dim, obs_dim), jnp.float32) / jnp.sqrt(obs_dim)
    return ContinuousBandit(M=m)


# ----------------------------------------------------------------------------------------------------------
# episodic chain


class ChainState(NamedTuple):
    pos: Array  # [N] int32, position in 0..n-1
    t: Array  # [N] int32, steps taken
    done: Array  # [N] bool, episode over (goal reached or horizon hit)


@struct.dataclass
class Chain:
    """A 1-D chain of ``n`` cells with a +1 terminal reward at the right end, cut at ``horizon`` steps."""

    n: int = struct.field(pytree_node=False, default=8)
    horizon: int = struct.field(pytree_node=False, default=8)

    @property
    def obs_dim(self) -> int:
        return self.n + 1

    @property
    def act_dim(self) -> int:
        return 2

    def observe(self, state: ChainState) -> Array:
        """One-hot position and ``t / horizon``, float32 ``[N, n + 1]``."""
        onehot = jax.nn.one_hot(state.pos, self.n, dtype=jnp.float32)
        frac = (state.t.astype(jnp.float32) / self.horizon)[..., None]
        return jnp.concatenate([onehot, frac], axis=-1)

    def reset(self, key: Array, num_envs: int) -> tuple[ChainState, Array]:
        """Start positions uniform in ``0..n-3``; returns ``(state, obs)``."""
        pos = jax.random.randint(key, (num_envs,), 0, self.n - 2, dtype=jnp.int32)
        zeros = jnp.zeros((num_envs,), jnp.int32)
        state = ChainState(pos=pos, t=zeros, done=jnp.zeros((num_envs,), bool))
        return state, self.observe(state)

    def step(self, state: ChainState, action: Array) -> tuple[ChainState, Array, Array, Array]:
        """One step for every env; finished envs stay put and get 0. Returns ``(state, obs, reward, done)``.

        ``reward`` and ``done`` refer to the transition just taken; ``done`` is True when this step reached
        the goal or the horizon (or the env was already done).
        """
        move = jnp.where(action == 1, 1, -1).astype(jnp.int32)
        alive = ~state.done
        pos = jnp.where(alive, jnp.clip(state.pos + move, 0, self.n - 1), state.pos)
        t = state.t + alive.astype(jnp.int32)
        at_goal = pos == self.n - 1
        reward = (alive & at_goal).astype(jnp.float32)
        done = state.done | at_goal | (t >= self.horizon)
        new = ChainState(pos=pos, t=t, done=done)
        return new, self.observe(new), reward, done

    def min_steps(self, pos: Array) -> Array:
        """Steps the optimal policy needs from ``pos`` (all starts are solvable when ``n - 1 <= horizon``)."""
        return self.n - 1 - pos
