"""Which problems a step trains on: the first of the rollout's three parts (ProblemSource, Sampler, Grader).

    source = ProblemSource(problems, rl_levels, cfg.curriculum, cfg.replay, prompts_per_step=B,
                           max_new_tokens=T)
    state = source.init_state()                                 # per-problem counts, curriculum, replay
    idx, replayed = source.draw(state, key, replay_key)         # ONE jitted draw: fresh (+ replayed) problems
    state, m = source.update(state, graded_rounds, replayed)    # ONE jitted update from the graded samples

Fresh problems are drawn uniformly without replacement or from the curriculum's P(q) (grpo_jax.curriculum);
when replay is on and its buffer holds anything, R = round(fraction x B) of the B problems are stored
successes drawn from the prioritized buffer (grpo_jax.replay) — their stored completion replaces the G-th
sample of the group (the rollout splices it in). The update counts every freshly sampled member (a replayed
member is not fresh evidence): attempts / passes per problem, the curriculum's pass rates, and for the
replay buffer the first success of every fresh group (priority (1 − s(q) + 0.01)^alpha) and the refreshed
priorities of the replayed items.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import curriculum, replay
from grpo_jax.config import CurriculumConfig, ReplayConfig
from grpo_jax.problem import Problem
from grpo_jax.rollout.state import ProblemStats, RolloutState


class GradedRound(NamedTuple):
    """What the update needs of one sampling round (host arrays unless stated)."""

    idx: np.ndarray  # [B] problem ids
    rewards: np.ndarray  # [B, G] all-pass rewards
    fresh: np.ndarray  # [B, G] 1 for freshly sampled members (0: a replayed success)
    samples: Any  # the round's SampleOutput (device arrays [B, G, T]): the replay items come from it


def replay_template(max_new: int) -> dict:
    """One replay item: the problem id (its prompt is re-encoded from it), the stored completion with its
    mask, behaviour log-probs and truncation flag. The reward is re-graded when the item is replayed."""
    return {
        "problem": jnp.zeros((), jnp.int32),
        "tokens": jnp.zeros((max_new,), jnp.int32),
        "mask": jnp.zeros((max_new,), jnp.float32),
        "logp": jnp.zeros((max_new,), jnp.float32),
        "truncated": jnp.zeros((), bool),
    }


class ProblemSource:
    """See the module docstring. `levels` are the run's training levels (the curriculum unlocks them in
    order); B = prompts_per_step."""

    def __init__(
        self,
        problems: Sequence[Problem],
        levels: Sequence[int],
        cur: CurriculumConfig,
        rep: ReplayConfig,
        *,
        prompts_per_step: int,
        max_new_tokens: int,
    ):
        self.problems, self.cur, self.rep = list(problems), cur, rep
        self.B, self.max_new = prompts_per_step, max_new_tokens
        lv = sorted(set(levels))
        self.levels = jnp.asarray(
            [lv.index(p.level) if p.level in lv else 0 for p in self.problems], jnp.int32
        )
        self.num_levels = len(lv)
        self.n_replay = int(round(rep.fraction * self.B)) if rep.enabled else 0
        self._draw = jax.jit(functools.partial(_draw, self.cur, self.B), static_argnames=("n_replay",))
        self._update = jax.jit(
            functools.partial(_update, self.cur, self.rep.alpha), static_argnames=("with_replay",)
        )

    def init_state(self) -> RolloutState:
        n = len(self.problems)
        rp = replay.init(replay_template(self.max_new), self.rep.capacity) if self.n_replay else None
        return RolloutState(
            stats=ProblemStats(jnp.zeros((n,), jnp.int32), jnp.zeros((n,), jnp.int32)),
            curriculum=curriculum.init(np.asarray(self.levels), self.num_levels, self.cur),
            replay=rp,
        )

    def draw(self, state: RolloutState, key: jax.Array, replay_key: jax.Array | None = None):
        """(problem ids [B] host, replayed items or None): B fresh problems; or, when `replay_key` is given
        and the buffer holds anything, B − R fresh ones then R stored successes (their items, device arrays
        [R, ...], with their buffer slots)."""
        n_rep = 0
        if replay_key is not None and self.n_replay and float(replay.total(state.replay)) > 0:
            n_rep = self.n_replay
        idx, replayed = self._draw(state, self.levels, key, replay_key, n_replay=n_rep)
        return np.asarray(idx), replayed

    def update(
        self, state: RolloutState, rounds: Sequence[GradedRound], replayed
    ) -> tuple[RolloutState, dict]:
        """The state after a step's graded rounds (see the module docstring) and its host metrics."""
        stacked = {
            "idx": jnp.asarray(np.stack([r.idx for r in rounds]), jnp.int32),
            "rewards": jnp.asarray(np.stack([r.rewards for r in rounds]), jnp.float32),
            "fresh": jnp.asarray(np.stack([r.fresh for r in rounds]), jnp.float32),
            "samples": jax.tree.map(lambda *x: jnp.stack(x), *[r.samples for r in rounds]),
        }
        state = self._update(state, self.levels, stacked, replayed, with_replay=bool(self.n_replay))
        m = {k: float(v) for k, v in jax.device_get(curriculum.level_rates(state.curriculum)).items()}
        cur = jax.device_get(state.curriculum)
        seen = cur.attempts > 0
        m["curriculum/mean_pass_rate_seen"] = float(cur.pass_rate[seen].mean()) if seen.any() else 0.0
        if self.n_replay:
            if replayed is not None:
                first = rounds[
                    0
                ]  # the replayed success is the G-th member of the first round's last R groups
                m["replay/replayed_groups"] = float(len(replayed["problem"]))
                m["replay/replayed_reward"] = float(first.rewards[first.fresh[:, -1] == 0, -1].mean())
            m["replay/size"] = float(state.replay.size)
            m["replay/total_priority"] = float(replay.total(state.replay))
        return state, m


def _draw(cur_cfg, B, state, levels, key, replay_key, *, n_replay):
    """The jitted draw: the first B − n_replay of B drawn problems (uniform without replacement, or the
    curriculum's), then n_replay stored successes (a static count: 0 = none)."""
    if cur_cfg.kind == "uniform":
        idx = jax.random.choice(key, levels.shape[0], (B,), replace=False)[: B - n_replay]
    else:
        idx = curriculum.sample(state.curriculum, cur_cfg, levels, key, B)[: B - n_replay]
    if not n_replay:
        return idx, None
    slots, items, _ = replay.sample(state.replay, replay_key, n_replay)
    return jnp.concatenate([idx.astype(jnp.int32), items["problem"].astype(jnp.int32)]), {
        **items,
        "slot": slots,
    }


def _update(cur_cfg, alpha, state, levels, rounds, replayed, *, with_replay=False):
    """The jitted update: counts and curriculum from every fresh sample of every round; replay insertions
    (the first success of each fresh group, round by round) and the replayed items' new priorities."""
    R, B, G = rounds["rewards"].shape
    idx = rounds["idx"].reshape(-1)
    counts = rounds["fresh"].sum(-1).reshape(-1).astype(jnp.int32)
    passed = (rounds["rewards"] * rounds["fresh"]).sum(-1).reshape(-1)
    stats = ProblemStats(
        attempts=state.stats.attempts.at[idx].add(counts),
        passes=state.stats.passes.at[idx].add(jnp.rint(passed).astype(jnp.int32)),
    )
    rate = (passed / jnp.maximum(counts, 1)).astype(jnp.float32)
    cur = curriculum.update(state.curriculum, cur_cfg, levels, idx, rate, counts)
    rp = state.replay
    if with_replay:
        s, b = cur.pass_rate, jnp.arange(B)
        for r in range(R):
            succ = (rounds["rewards"][r] >= 1.0) & (rounds["fresh"][r] > 0)
            first = jnp.argmax(succ, axis=1)
            out = jax.tree.map(lambda x, r=r: x[r], rounds["samples"])
            items = {
                "problem": rounds["idx"][r],
                "tokens": out.tokens[b, first],
                "mask": out.mask[b, first],
                "logp": out.logp[b, first],
                "truncated": out.truncated[b, first],
            }
            prio = replay.success_priority(jnp.ones(B), s[rounds["idx"][r]], alpha=alpha)
            rp = replay.add(rp, items, prio, succ.any(1))
        if replayed is not None:
            prio = replay.success_priority(
                jnp.ones(replayed["problem"].shape[0]), s[replayed["problem"]], alpha=alpha
            )
            rp = replay.update_priorities(rp, replayed["slot"], prio)
    return dataclasses.replace(state, stats=stats, curriculum=cur, replay=rp)
