"""Host side of the policy pool in the code-generation loop: push snapshots, evaluate members, score them.

The math and the stacked state live in grpo_jax.pool (pure, jitted); this module only moves tokens to the
sandbox and rewards back, like the rollout does for the current policy (grpo_jax.rollout.codegen calls it):

  * `maybe_push(pool, params, step, key)`: every `push_every` steps (step > 0) the trainable parameters
    (full, or LoRA adapters) enter the ring buffer, `pushed_at = step`;
  * `baseline(...)`: when the objective's baseline uses the pool and it holds a snapshot, M slots among the K
    active ones (K from the schedule at this step, as data) are selected with the step's "pool_select" key,
    sample `samples_per_member` completions of the step's B prompts in ONE vmapped call ("pool_sample" key,
    one split per member; exploration members at their own temperature), and the sandbox scores them:
    b_pool(q) = their mean reward per prompt;
  * `metrics(pool, step)`: size, active K, exploration members, mean age, diversity.
All randomness comes from the rollout's named keys, so a resumed run reproduces the pool exactly.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import pool
from grpo_jax.config import PoolConfig, RolloutConfig
from grpo_jax.policies import sampling
from grpo_jax.problem import Problem
from grpo_jax.rollout.grader import Grader
from grpo_jax.runtime.sharding import to_host
from grpo_jax.tokenization import stop_ids
from grpo_jax.types import SampleOutput


class Members(NamedTuple):
    """The pool members one call samples with: the stacked pool parameters, the M selected slots, the LoRA
    base (or None) and each member's temperature."""

    stacked: Any
    idx: jax.Array  # [M] slots
    frozen: Any
    temperatures: jax.Array  # [M]


class MemberSampler:
    """A Sampler of M pool members at once (one vmapped while-loop; LoRA members on one copy of the base):
    `generate(members, prompt, prompt_mask, key)` -> SampleOutput [M, B, g, T], one key split per member."""

    def __init__(self, model_cfg, ro: RolloutConfig, *, group: int, eos_ids, pad_id: int, lora_alpha):
        self.sp = sampling.sampling_params(ro.temperature, ro.top_k, ro.top_p)
        self._fn = pool.make_member_sampler(
            model_cfg,
            group=group,
            max_new=ro.max_new_tokens,
            eos_id=eos_ids,
            pad_id=pad_id,
            lora_alpha=lora_alpha,
        )

    def generate(self, members: Members, prompt, prompt_mask, key) -> SampleOutput:
        keys = jax.random.split(key, members.idx.shape[0])
        m = members
        return self._fn(
            m.stacked,
            m.idx,
            m.frozen,
            prompt,
            prompt_mask,
            keys,
            m.temperatures,
            self.sp.top_k,
            self.sp.top_p,
        )


class PoolRuntime:
    def __init__(
        self,
        pcfg: PoolConfig,
        rollout: RolloutConfig,
        model_cfg,
        tok,
        grader: Grader,
        *,
        uses_baseline: bool,
        lora_alpha: float | None,
    ):
        self.pc, self.rollout, self.tok, self.grader = pcfg, rollout, tok, grader
        self.uses_baseline = uses_baseline
        self.m = pcfg.members_per_step
        self.sampler = MemberSampler(
            model_cfg,
            rollout,
            group=pcfg.samples_per_member,
            eos_ids=stop_ids(tok),
            pad_id=tok.pad_id,
            lora_alpha=lora_alpha,
        )
        self._select = jax.jit(pool.select_members, static_argnums=3)
        noise = pcfg.explore_noise if pcfg.explore_mode == "param_noise" else 0.0
        push = functools.partial(pool.push, explore_fraction=pcfg.explore_fraction, noise=noise)
        self._push = jax.jit(push)  # not donated: an async rollout may still read the previous pool
        self._diversity = jax.jit(pool.diversity)
        self._temps = jax.jit(
            functools.partial(
                pool.member_temperatures,
                base=rollout.temperature,
                explore_temperature=pcfg.explore_temperature,
                use_explore=pcfg.explore_mode == "temperature" and pcfg.explore_fraction > 0,
            )
        )

    def init(self, params: Any) -> pool.PoolState:
        return pool.init(params, self.pc.capacity)

    def maybe_push(self, pool_state, params: Any, step: int, key: jax.Array):
        """The pool after the push due at `step` (a snapshot every push_every steps, none at step 0)."""
        if step == 0 or step % self.pc.push_every:
            return pool_state
        return self._push(pool_state, params, jnp.int32(step), key=key)

    def baseline(
        self,
        pool_state,
        frozen,
        keys: dict[str, jax.Array],
        problems: Sequence[Problem],
        prompt: jax.Array,
        pmask: jax.Array,
        step: int,
    ) -> tuple[np.ndarray | None, np.ndarray | None, dict[str, float]]:
        """(b_pool [B], valid [B] float, metrics) for this step's prompts; (None, None, {}) while the pool is
        empty. keys: the step's named keys ("pool_select", "pool_sample")."""
        if int(pool_state.pushes) == 0:
            return None, None, {}
        t0 = time.perf_counter()
        k = self.pc.k_at(step)
        idx, mmask = self._select(pool_state, jnp.int32(k), keys["pool_select"], self.m)
        members = Members(pool_state.params, idx, frozen, self._temps(pool_state, idx))
        out = self.sampler.generate(members, prompt, pmask, keys["pool_sample"])
        toks, cmask, mm = to_host((out.tokens, out.mask, mmask))
        b, g = len(problems), self.pc.samples_per_member
        rewards = np.full((self.m, b, g), np.nan, np.float32)
        act = np.flatnonzero(mm)
        t1 = time.perf_counter()
        if act.size:
            grades = self.grader.grade(list(problems) * act.size, toks[act], cmask[act])
            rewards[act] = grades.rewards.reshape(act.size, b, g)
        base, has = pool.returns_baseline(jnp.asarray(rewards), mmask)
        explore = np.asarray(pool_state.explore)[np.asarray(idx)] & mm
        per_member = np.nanmean(rewards[act], axis=(1, 2)) if act.size else np.zeros(0)
        metrics = {
            "pool/members_evaluated": float(act.size),
            "pool/explore_evaluated": float(explore.sum()),
            "pool/member_reward": float(per_member.mean()) if act.size else 0.0,
            "pool/member_reward_spread": float(per_member.std()) if act.size else 0.0,
            "time/pool_sample_s": t1 - t0,
            "time/pool_reward_s": time.perf_counter() - t1,
        }
        return np.asarray(base), np.asarray(has, np.float32), metrics

    def metrics(self, p, step: int, with_diversity: bool) -> dict[str, float]:
        """The pool as the rollout of `step` sees it."""
        k = self.pc.k_at(step)
        active = np.asarray(pool.active_mask(p, jnp.int32(k)))
        ages = np.asarray(pool.ages(p, jnp.int32(step)))
        m = {
            "pool/size": float(np.asarray(p.valid).sum()),
            "pool/active_k": float(active.sum()),
            "pool/k_schedule": float(k),
            "pool/explore_members": float((np.asarray(p.explore) & active).sum()),
            "pool/mean_age": float(ages[active].mean()) if active.any() else 0.0,
        }
        if with_diversity:
            m["pool/diversity"] = float(self._diversity(p, jnp.int32(k)))
        return m
