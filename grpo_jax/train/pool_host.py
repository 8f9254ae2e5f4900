"""Host side of the policy pool in the code-generation loop: push snapshots, evaluate members, score them.

The math and the stacked state live in grpo_jax.pool (pure, jitted); this module only moves tokens to the
sandbox and rewards back, like the rollout does for the current policy (grpo_jax.train.rollout calls it):

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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import pool
from grpo_jax.codegen import pipeline
from grpo_jax.config import PoolConfig, RolloutConfig
from grpo_jax.policies import sampling
from grpo_jax.problem import Problem
from grpo_jax.sandbox.executor import Executor
from grpo_jax.train.sharding import to_host


class PoolRuntime:
    def __init__(
        self,
        pcfg: PoolConfig,
        rollout: RolloutConfig,
        model_cfg,
        tok,
        *,
        uses_baseline: bool,
        lora_alpha: float | None,
        deadline_s: float,
        fmt: pipeline.PromptFormat = pipeline.PLAIN,
    ):
        self.pc, self.rollout, self.tok, self.deadline_s, self.fmt = pcfg, rollout, tok, deadline_s, fmt
        self.uses_baseline = uses_baseline
        self.m = pcfg.members_per_step
        self.sp = sampling.sampling_params(rollout.temperature, rollout.top_k, rollout.top_p)
        self.sampler = pool.make_member_sampler(
            model_cfg,
            group=pcfg.samples_per_member,
            max_new=rollout.max_new_tokens,
            eos_id=pipeline.stop_ids(tok),
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
        executor: Executor,
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
        temps = self._temps(pool_state, idx)
        out = self.sampler(
            pool_state.params,
            idx,
            frozen,
            prompt,
            pmask,
            jax.random.split(keys["pool_sample"], self.m),
            temps,
            self.sp.top_k,
            self.sp.top_p,
        )
        toks, cmask, mm = to_host((out.tokens, out.mask, mmask))
        b, g = len(problems), self.pc.samples_per_member
        rewards = np.full((self.m, b, g), np.nan, np.float32)
        act = np.flatnonzero(mm)
        t1 = time.perf_counter()
        if act.size:
            texts = pipeline.decode_completions(self.tok, toks[act], cmask[act])
            probs = list(problems) * act.size
            _, r = pipeline.score_completions(executor, probs, texts, g, self.deadline_s, self.fmt)
            rewards[act] = r.reshape(act.size, b, g)
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
