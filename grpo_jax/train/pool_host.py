"""Host side of the policy pool in the code-generation loop: evaluate members, score them, push snapshots.

The math and the stacked state live in grpo_jax.pool (pure, jitted); this module only moves tokens to the
sandbox and rewards back, like the loop does for the current policy. Per GRPO step, when the objective's
baseline uses the pool (`--baseline=pool|mix`) and the pool holds a snapshot:

  1. select M slots among the K active ones (K from the schedule, as data) with the step's "sample" key;
  2. the M members sample `samples_per_member` completions of the step's B prompts in ONE vmapped call
     (exploration members at their own temperature);
  3. the sandbox scores the active members' completions; b_pool(q) = their mean reward per prompt.

Every `push_every` steps the trained parameters (full, or LoRA adapters) are pushed into the ring buffer.
All randomness comes from the TrainState's streams, so a resumed run reproduces the pool exactly.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import pool
from grpo_jax.codegen import pipeline
from grpo_jax.codegen.problem import Problem
from grpo_jax.codegen.tokenizer import CodeTokenizer
from grpo_jax.config import PoolConfig, RolloutConfig
from grpo_jax.policies import sampling
from grpo_jax.sandbox.executor import Executor


class PoolRuntime:
    def __init__(
        self,
        pcfg: PoolConfig,
        rollout: RolloutConfig,
        model_cfg,
        tok: CodeTokenizer,
        *,
        uses_baseline: bool,
        member_fn: Callable[[Any, Any], Any] | None,
        deadline_s: float,
    ):
        self.pc, self.rollout, self.tok, self.deadline_s = pcfg, rollout, tok, deadline_s
        self.uses_baseline = uses_baseline
        self.m = pcfg.members_per_step
        self.sp = sampling.sampling_params(rollout.temperature, rollout.top_k, rollout.top_p)
        self.sampler = pool.make_member_sampler(
            model_cfg,
            group=pcfg.samples_per_member,
            max_new=rollout.max_new_tokens,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            member_fn=member_fn,
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

    def baseline(
        self,
        pool_state,
        frozen,
        sample_key: jax.Array,
        executor: Executor,
        problems: Sequence[Problem],
        prompt: np.ndarray,
        pmask: np.ndarray,
        step: int,
    ) -> tuple[np.ndarray | None, np.ndarray | None, dict[str, float]]:
        """(b_pool [B], valid [B] float, metrics) for this step's prompts; (None, None, {}) when unused.

        sample_key: the step's "sample" key (the policy samples with it; the pool folds in 1)."""
        if not self.uses_baseline or int(pool_state.pushes) == 0:
            return None, None, {}
        t0 = time.perf_counter()
        key = jax.random.fold_in(sample_key, 1)
        k = self.pc.k_at(step)
        idx, mmask = self._select(pool_state, jnp.int32(k), jax.random.fold_in(key, 0), self.m)
        temps = self._temps(pool_state, idx)
        keys = jax.random.split(jax.random.fold_in(key, 1), self.m)
        out = self.sampler(
            pool_state.params,
            idx,
            frozen,
            jnp.asarray(prompt),
            jnp.asarray(pmask),
            keys,
            temps,
            self.sp.top_k,
            self.sp.top_p,
        )
        toks, cmask, mm = np.asarray(out.tokens), np.asarray(out.mask), np.asarray(mmask)
        b, g = len(problems), self.pc.samples_per_member
        rewards = np.full((self.m, b, g), np.nan, np.float32)
        act = np.flatnonzero(mm)
        t1 = time.perf_counter()
        if act.size:
            texts = pipeline.decode_completions(self.tok, toks[act], cmask[act])
            _, r = pipeline.score_completions(executor, list(problems) * act.size, texts, g, self.deadline_s)
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

    def after_step(self, state, step_done: int, with_diversity: bool):
        """Push a snapshot when `step_done` is a multiple of push_every; returns (state, metrics)."""
        if step_done % self.pc.push_every == 0:
            key = jax.random.fold_in(state.key("train"), 7)
            state = state.replace(pool=self._push(state.pool, state.params, jnp.int32(step_done), key=key))
        p = state.pool
        k = self.pc.k_at(step_done)
        active = np.asarray(pool.active_mask(p, jnp.int32(k)))
        ages = np.asarray(pool.ages(p, jnp.int32(step_done)))
        m = {
            "pool/size": float(np.asarray(p.valid).sum()),
            "pool/active_k": float(active.sum()),
            "pool/k_schedule": float(k),
            "pool/explore_members": float((np.asarray(p.explore) & active).sum()),
            "pool/mean_age": float(ages[active].mean()) if active.any() else 0.0,
        }
        if with_diversity:
            m["pool/diversity"] = float(self._diversity(p, jnp.int32(k)))
        return state, m
