"""The device/host boundary of the code loop: problems -> sampled groups -> sandbox -> RolloutBatch.

One interface, whatever the options:

    rollout = make_rollout(cfg, tok, executor, problems, model_cfg, param_fn)
    rollout.bind(frozen)                                           # the LoRA base (None: full fine-tuning)
    state = rollout.init_state(trainable_params)                   # RolloutState (checkpointed in RunState)
    state, batch, info = rollout.produce(state, params, key, step) # the batch GRPO step `step` trains on
    ... train step ...
    state = rollout.settle(state)                                  # before logging / checkpointing

`params` are the trainable parameters after `step` updates, `key` the run's "rollout" stream (every random
choice of the step is a named key below it, `step_keys`), `info` the host metrics and logged samples. The
synchronous rollout's `settle` does nothing; `AsyncRollout` wraps the same interface: its `produce` returns
the batch graded while the previous step trained and starts the next one in a worker thread, and its
`settle` waits for it, so the loop has no async branch.

One `produce` of CodegenRollout:
  1. pool push: every `pool.push_every` steps a snapshot of `params` enters the policy pool;
  2. problems: B − R fresh ones (uniform, or the curriculum's P(q), grpo_jax.curriculum) and R = round(
     replay.fraction · B) drawn from the prioritized replay buffer (grpo_jax.replay) when it holds any;
  3. G completions per prompt, sampled on the device; for a replayed problem the G-th member is replaced
     (on the device) by the stored success, with its stored behaviour log-probs (TIS-corrected in the loss);
  4. tokens out: the host decodes the completions and the sandbox grades them (all-pass rewards [B, G],
     per-test results [B, G, M]); rewards in;
  5. dynamic sampling (DAPO): groups whose rewards are all equal are refilled with fresh draws, at most
     `dynamic_max_rounds` extra rounds; the batch is gathered on the device from the kept rows; groups still
     missing are masked out (group_mask 0);
  6. the pool baseline b_pool(q) for the final prompts (grpo_jax.train.pool_host), if the objective uses it;
  7. rollout-side state: per-problem attempt counts and curriculum pass rates (every graded fresh sample),
     replay insertions (the first success of each fresh group; priority (1 − s(q) + eps)^alpha) and the
     priorities of the replayed items.
Samples stay on the device; the host sees token ids (to decode) and sends back rewards and row indices.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import curriculum, replay
from grpo_jax import rng as rng_lib
from grpo_jax.codegen import pipeline
from grpo_jax.codegen.rewards import child_checked_fractions, failure_counts, per_test_rewards
from grpo_jax.config import RunConfig
from grpo_jax.policies import sampling
from grpo_jax.problem import Problem
from grpo_jax.sandbox.executor import Executor
from grpo_jax.tokenization.code import CodeTokenizer
from grpo_jax.train import sharding
from grpo_jax.train.distributed import Context
from grpo_jax.train.pool_host import PoolRuntime
from grpo_jax.train.state import ProblemStats, RolloutState
from grpo_jax.types import RolloutBatch, SampleOutput, batch_from_samples, empty_batch


@dataclasses.dataclass
class RolloutInfo:
    metrics: dict[str, float]  # host-side metrics of the rollout (timing, sandbox, curriculum, pool, replay)
    samples: list[dict]  # one logged sample per group (task, completion, status, reward)


class Rollout(Protocol):
    def init_state(self, params: Any) -> RolloutState: ...

    def produce(
        self, state: RolloutState, params: Any, key: jax.Array, step: int
    ) -> tuple[RolloutState, RolloutBatch, RolloutInfo]: ...

    def settle(self, state: RolloutState) -> RolloutState: ...

    def bind(self, frozen: Any) -> None: ...

    def host_state(self) -> dict: ...

    def load_host_state(self, d: dict) -> None: ...

    def close(self) -> None: ...


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


def kept(rewards: np.ndarray) -> np.ndarray:
    """[B] bool: groups whose rewards are not all equal (the ones with a GRPO signal; DAPO's filter)."""
    return np.ptp(rewards, axis=1) > 0


@dataclasses.dataclass
class _Round:
    """One sampling round: B problems, their device samples and the host's grades."""

    idx: np.ndarray  # [B] problem ids
    prompt: np.ndarray  # [B, P]
    pmask: np.ndarray  # [B, P]
    out: SampleOutput  # device arrays [B, G, T]
    rewards: np.ndarray  # [B, G]
    tests: np.ndarray  # [B, G, M]
    test_mask: np.ndarray  # [B, M]
    texts: list[str]
    verdicts: list
    replayed: np.ndarray  # [B] bool: the group's G-th member is a replayed success
    tokens: int
    t_sample: float
    t_reward: float

    def fresh(self, g: int) -> np.ndarray:
        """[B, G] 1 for freshly sampled members (a replayed G-th member is not fresh evidence)."""
        return np.where(self.replayed[:, None] & (np.arange(g) == g - 1)[None], 0.0, 1.0)


class CodegenRollout:
    """The synchronous rollout of the code-generation loop (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        tok: CodeTokenizer,
        executor: Executor,
        problems: Sequence[Problem],
        model_cfg,
        param_fn=None,
        frozen: Any = None,
        *,
        ctx: Context | None = None,
        batch_sharding: Any = None,
    ):
        self.cfg, self.tok, self.executor, self.problems = cfg, tok, executor, list(problems)
        self.param_fn, self.frozen = param_fn, frozen
        self.G, self.B = cfg.rollout.group_size, cfg.rollout.prompts_per_step
        # multi-process: every process samples the whole (sharded) batch, grades its own rows and receives
        # the other processes' grades; single process: it owns every row
        self.ctx = ctx or Context()
        self.batch_sharding = batch_sharding
        self.owned = np.ones(self.B, bool)
        if batch_sharding is not None:
            self.owned = sharding.owned_rows(self.B, batch_sharding)
        lv = sorted(set(cfg.tasks.rl_levels))
        self.levels = jnp.asarray(
            [lv.index(p.level) if p.level in lv else 0 for p in self.problems], jnp.int32
        )
        self.num_levels = len(lv)
        self.num_tests = max(1, max(len(p.tests) for p in self.problems))
        r = cfg.rollout
        self.sp = sampling.sampling_params(r.temperature, r.top_k, r.top_p)
        self.sampler = sampling.make_sampler(
            model_cfg,
            group=self.G,
            max_new=r.max_new_tokens,
            eos_id=pipeline.stop_ids(tok),
            pad_id=tok.pad_id,
        )
        self.fmt = cfg.tasks.prompt
        self.ccfg = cfg.curriculum
        self.rounds = cfg.rollout.dynamic_max_rounds if cfg.rollout.dynamic_sampling else 0
        self.n_replay = int(round(cfg.replay.fraction * self.B)) if cfg.replay.enabled else 0
        self.pool_rt = None
        if cfg.pool.enabled:
            self.pool_rt = PoolRuntime(
                cfg.pool,
                cfg.rollout,
                model_cfg,
                tok,
                uses_baseline=cfg.objective.baseline != "group",
                lora_alpha=cfg.lora.alpha if cfg.lora.enabled else None,
                deadline_s=cfg.sandbox.deadline_s,
                fmt=cfg.tasks.prompt,
            )
        self._cur_sample = jax.jit(curriculum.sample, static_argnums=(1, 4))
        self._cur_update = jax.jit(curriculum.update, static_argnums=1)
        self._rp_add = jax.jit(replay.add)
        self._rp_sample = jax.jit(replay.sample, static_argnums=2)
        self._rp_update = jax.jit(replay.update_priorities)

    # ---- state
    def init_state(self, params: Any) -> RolloutState:
        """The rollout state of a fresh run; `params` (the trainable tree) shapes the pool's slots."""
        n = len(self.problems)
        rp = None
        if self.n_replay:
            rp = replay.init(replay_template(self.cfg.rollout.max_new_tokens), self.cfg.replay.capacity)
        return RolloutState(
            stats=ProblemStats(jnp.zeros((n,), jnp.int32), jnp.zeros((n,), jnp.int32)),
            curriculum=curriculum.init(np.asarray(self.levels), self.num_levels, self.ccfg),
            pool=None if self.pool_rt is None else self.pool_rt.init(params),
            replay=rp,
        )

    def settle(self, state: RolloutState) -> RolloutState:
        return state

    def bind(self, frozen: Any) -> None:
        """The read-only parameters the rollout samples with (the LoRA base; None for full fine-tuning),
        known once the run state exists (after SFT or a restore)."""
        self.frozen = frozen

    def host_state(self) -> dict:
        return {}

    def load_host_state(self, d: dict) -> None:
        del d

    def close(self) -> None:
        pass

    def step_keys(self, key: jax.Array, step: int) -> dict[str, jax.Array]:
        """Every named key one step may use (tests check that they are pairwise distinct)."""
        names = ["problems", "replay_draw", "pool_push_noise", "pool_select", "pool_sample"]
        names += [f"sample/{r}" for r in range(self.rounds + 1)]
        names += [f"refill_problems/{r}" for r in range(1, self.rounds + 1)]
        k = rng_lib.derive(key, step)
        return {n: rng_lib.derive(k, n) for n in names}

    # ---- one rollout
    def produce(self, state: RolloutState, params: Any, key: jax.Array, step: int):
        keys = self.step_keys(key, step)
        m: dict[str, float] = {}
        pool = state.pool
        if self.pool_rt is not None:
            pool = self.pool_rt.maybe_push(pool, params, step, keys["pool_push_noise"])
            m.update(self.pool_rt.metrics(pool, step, with_diversity=step % self.cfg.log.every == 0))
        full = params if self.param_fn is None else self.param_fn(params, self.frozen)
        # 1. problems (fresh + replayed)
        replayed, n_rep = None, 0
        if self.n_replay and float(replay.total(state.replay)) > 0:
            n_rep = self.n_replay
            slots, replayed, _ = self._rp_sample(state.replay, keys["replay_draw"], n_rep)
            replayed = {**replayed, "slot": slots}
        idx = self._choose(state, keys["problems"], self.B - n_rep)
        if n_rep:
            idx = np.concatenate([idx, np.asarray(replayed["problem"])])
        rounds = [self._sample_and_grade(full, idx, keys["sample/0"], replayed)]
        # 5. dynamic sampling: refill all-equal groups
        if self.rounds:
            m["dynamic/frac_zero_std_first_round"] = float(1.0 - kept(rounds[0].rewards).mean())
            for r in range(1, self.rounds + 1):
                if sum(int(kept(x.rewards).sum()) for x in rounds) >= self.B:
                    break
                extra = self._choose(state, keys[f"refill_problems/{r}"], self.B)
                rounds.append(self._sample_and_grade(full, extra, keys[f"sample/{r}"]))
        batch, rows = self._assemble(rounds, m)
        # 6. pool baseline for the final prompts
        if self.pool_rt is not None and self.pool_rt.uses_baseline:
            probs = [self.problems[rounds[ri].idx[b]] for ri, b in rows]
            base, valid, pm = self.pool_rt.baseline(
                pool, self.frozen, keys, self.executor, probs, batch.prompt, batch.prompt_mask, step
            )
            if base is not None:
                batch = batch.replace(baseline=jnp.asarray(base), baseline_valid=jnp.asarray(valid))
            m.update(pm)
        # 7. rollout-side state
        state = self._update_state(state.replace(pool=pool), rounds, replayed, m)
        m.update(self._round_metrics(rounds))
        samples = [self._sample_row(rounds[ri], b) for ri, b in rows]
        return state, self._place(batch), RolloutInfo(m, samples)

    def _place(self, batch: RolloutBatch) -> RolloutBatch:
        """The batch as global arrays split over the mesh's batch axes (what the train step expects)."""
        return batch if self.batch_sharding is None else sharding.put(batch, self.batch_sharding)

    def _rows(self, x: np.ndarray) -> Any:
        """Host rows [B, ...] -> the device, split over the batch axes."""
        return jnp.asarray(x) if self.batch_sharding is None else sharding.put(x, self.batch_sharding)

    def _choose(self, state: RolloutState, key: jax.Array, n: int) -> np.ndarray:
        if self.ccfg.kind == "uniform":
            return np.asarray(jax.random.choice(key, len(self.problems), (self.B,), replace=False))[:n]
        return np.asarray(self._cur_sample(state.curriculum, self.ccfg, self.levels, key, self.B))[:n]

    def _sample_and_grade(self, params, idx: np.ndarray, key: jax.Array, replayed=None) -> _Round:
        """Sample G completions for problems idx [B] on the device; decode and grade on the host."""
        probs = [self.problems[i] for i in idx]
        prompt, pmask = pipeline.encode_prompts(self.tok, probs, self.cfg.tasks.prompt_len, self.fmt)
        t0 = time.perf_counter()
        out = self.sampler(params, self._rows(prompt), self._rows(pmask), key, self.sp)
        n_rep = 0 if replayed is None else int(replayed["problem"].shape[0])
        if n_rep:  # the G-th member of the last n_rep groups is the stored success (on the device)
            at = (slice(self.B - n_rep, None), self.G - 1)
            out = SampleOutput(
                tokens=out.tokens.at[at].set(replayed["tokens"]),
                logp=out.logp.at[at].set(replayed["logp"]),
                mask=out.mask.at[at].set(replayed["mask"]),
                lengths=out.lengths.at[at].set(replayed["mask"].sum(-1).astype(jnp.int32)),
                truncated=out.truncated.at[at].set(replayed["truncated"]),
            )
        tokens, mask = self.ctx.host((out.tokens, out.mask))  # tokens out (every process: all rows)
        t1 = time.perf_counter()
        texts = pipeline.decode_completions(self.tok, tokens, mask)
        verdicts, rewards = self._grade(probs, texts)
        n_tests = [len(p.tests) for p in probs for _ in range(self.G)]
        tv, tm = per_test_rewards(verdicts, self.num_tests, n_tests)
        return _Round(
            idx=np.asarray(idx),
            prompt=prompt,
            pmask=pmask,
            out=out,
            rewards=rewards,
            tests=tv.reshape(self.B, self.G, self.num_tests),
            test_mask=tm.reshape(self.B, self.G, self.num_tests)[:, 0],
            texts=texts,
            verdicts=verdicts,
            replayed=np.arange(self.B) >= self.B - n_rep,
            tokens=int(mask.sum()),
            t_sample=t1 - t0,
            t_reward=time.perf_counter() - t1,
        )

    def _grade(self, probs: list[Problem], texts: list[str]) -> tuple[list, np.ndarray]:
        """Grade this process's rows in its own sandbox; with several processes, exchange the grades so every
        process holds the verdicts and rewards [B, G] of every row."""
        G, dl = self.G, self.cfg.sandbox.deadline_s
        if not self.ctx.multi:
            return pipeline.score_completions(self.executor, probs, texts, G, dl, self.fmt)
        mine = np.flatnonzero(self.owned)
        my_texts = [texts[b * G + g] for b in mine for g in range(G)]
        v, r = pipeline.score_completions(self.executor, [probs[b] for b in mine], my_texts, G, dl, self.fmt)
        verdicts: list = [None] * (len(probs) * G)
        rewards = np.zeros((len(probs), G), r.dtype)
        for rows, vs, rs in self.ctx.allgather_objects("grades", (mine, v, r)):
            for i, b in enumerate(rows):
                verdicts[b * G : (b + 1) * G] = vs[i * G : (i + 1) * G]
                rewards[b] = rs[i]
        missing = [b for b in range(len(probs)) if verdicts[b * G] is None]
        if missing:
            raise RuntimeError(f"rollout: no process graded rows {missing} (the row owners do not cover B)")
        return verdicts, rewards

    def _assemble(self, rounds: list[_Round], m: dict) -> tuple[RolloutBatch, list[tuple[int, int]]]:
        """The batch: round 0 as it is, or (dynamic sampling) the kept groups of every round first, then
        round 0's all-equal groups as masked filler. Device arrays are gathered by row on the device."""
        B, G = self.B, self.G
        group_mask = np.ones((B, G), np.float32)
        rows = [(0, b) for b in range(B)]
        if self.rounds:
            rows = [(ri, b) for ri, x in enumerate(rounds) for b in np.flatnonzero(kept(x.rewards))][:B]
            n_kept = len(rows)
            rows += [(0, b) for b in np.flatnonzero(~kept(rounds[0].rewards))][: B - n_kept]
            group_mask = np.repeat((np.arange(B) < n_kept)[:, None], G, axis=1).astype(np.float32)
            m["dynamic/rounds"] = float(len(rounds) - 1)
            m["dynamic/kept_groups"] = float(n_kept)

        def pick(name):
            return np.stack([getattr(rounds[ri], name)[b] for ri, b in rows])

        if len(rounds) == 1 and rows == [(0, b) for b in range(B)]:
            out = rounds[0].out
        else:
            flat = jnp.asarray([ri * B + b for ri, b in rows], jnp.int32)
            out = SampleOutput(
                *(jnp.concatenate([getattr(x.out, f) for x in rounds])[flat] for f in SampleOutput._fields)
            )
        batch = batch_from_samples(
            pick("prompt"),
            pick("pmask"),
            out,
            pick("rewards"),
            group_mask=group_mask,
            test_rewards=pick("tests"),
            test_mask=pick("test_mask"),
        )
        return batch, rows

    def _update_state(self, state: RolloutState, rounds: list[_Round], replayed, m: dict) -> RolloutState:
        """Attempt counts and curriculum rates from every graded fresh sample; replay insertions / refresh."""
        G = self.G
        idx = np.concatenate([x.idx for x in rounds])
        fresh = [x.fresh(G) for x in rounds]
        counts = np.concatenate([f.sum(1) for f in fresh]).astype(np.int32)
        passed = np.concatenate([(x.rewards * f).sum(1) for x, f in zip(rounds, fresh, strict=True)])
        stats = ProblemStats(
            attempts=state.stats.attempts.at[idx].add(jnp.asarray(counts)),
            passes=state.stats.passes.at[idx].add(jnp.asarray(np.rint(passed).astype(np.int32))),
        )
        cur = self._cur_update(
            state.curriculum,
            self.ccfg,
            self.levels,
            jnp.asarray(idx),
            jnp.asarray(passed / np.maximum(counts, 1), jnp.float32),
            jnp.asarray(counts),
        )
        rp = state.replay
        if self.n_replay:
            rp = self._update_replay(rp, cur, rounds, replayed, m)
        m.update({k: float(v) for k, v in jax.device_get(curriculum.level_rates(cur)).items()})
        seen = np.asarray(cur.attempts) > 0
        m["curriculum/mean_pass_rate_seen"] = (
            float(np.asarray(cur.pass_rate)[seen].mean()) if seen.any() else 0.0
        )
        return state.replace(stats=stats, curriculum=cur, replay=rp)

    def _update_replay(self, rp, cur, rounds: list[_Round], replayed, m: dict):
        """Insert the first success of every fresh group; refresh the priorities of the replayed items."""
        s = np.asarray(cur.pass_rate)
        a = self.cfg.replay.alpha
        b = jnp.arange(self.B)
        for x in rounds:
            succ = (x.rewards >= 1.0) & (x.fresh(self.G) > 0)
            first = jnp.asarray(np.argmax(succ, axis=1))
            items = {
                "problem": jnp.asarray(x.idx, jnp.int32),
                "tokens": x.out.tokens[b, first],
                "mask": x.out.mask[b, first],
                "logp": x.out.logp[b, first],
                "truncated": x.out.truncated[b, first],
            }
            prio = replay.success_priority(jnp.ones(self.B), jnp.asarray(s[x.idx]), alpha=a)
            rp = self._rp_add(rp, items, prio, jnp.asarray(succ.any(1)))
        if replayed is not None:
            problems = np.asarray(replayed["problem"])
            prio = replay.success_priority(jnp.ones(len(problems)), jnp.asarray(s[problems]), alpha=a)
            rp = self._rp_update(rp, replayed["slot"], prio)
            x = rounds[0]
            m["replay/replayed_groups"] = float(len(problems))
            m["replay/replayed_reward"] = float(x.rewards[x.replayed, self.G - 1].mean())
        m["replay/size"] = float(rp.size)
        m["replay/total_priority"] = float(replay.total(rp))
        return rp

    def _round_metrics(self, rounds: list[_Round]) -> dict[str, float]:
        verdicts = [v for x in rounds for v in x.verdicts]
        t_s, t_r = sum(x.t_sample for x in rounds), sum(x.t_reward for x in rounds)
        m = {
            "time/sample_s": t_s,
            "time/reward_s": t_r,
            "throughput/sample_tokens_per_s": sum(x.tokens for x in rounds) / max(t_s, 1e-9),
            "sandbox/programs_per_s": len(verdicts) / max(t_r, 1e-9),  # result-cache hits included
            "sandbox/cache_hits": float(sum(v.cached for v in verdicts)),
        }
        m.update({f"sandbox/{k}": float(v) for k, v in failure_counts(verdicts).items()})
        m.update({f"sandbox/{k}": v for k, v in child_checked_fractions(verdicts).items()})
        return m

    def _sample_row(self, x: _Round, b: int) -> dict:
        return {
            "task_id": self.problems[x.idx[b]].task_id,
            "completion": x.texts[b * self.G],
            "status": x.verdicts[b * self.G].status.value,
            "reward": float(x.rewards[b, 0]),
        }


class AsyncRollout:
    """The same interface, one step ahead: `produce(step)` returns the batch graded while step − 1 trained
    (or produces it now when there is none, e.g. the first step) and starts step + 1 in a worker thread from
    a copy of `params` (one step off-policy: the loss corrects it with --tis_cap); `settle` waits for that
    rollout and puts its batch into `state.pending`, so every checkpoint holds the graded next batch and a
    resumed run continues bit-identically. Pool snapshots are pushed from the policy that sampled (π_θ of
    the step before)."""

    def __init__(self, inner: CodegenRollout):
        self.inner = inner
        self._threads = ThreadPoolExecutor(max_workers=1)
        self._future: Future | None = None
        self._pending_step: int | None = None
        self._pending_info: RolloutInfo | None = None

    def init_state(self, params: Any) -> RolloutState:
        c = self.inner.cfg
        shape = (
            c.rollout.prompts_per_step,
            c.rollout.group_size,
            c.tasks.prompt_len,
            c.rollout.max_new_tokens,
        )
        return self.inner.init_state(params).replace(pending=empty_batch(*shape, self.inner.num_tests))

    def produce(self, state: RolloutState, params: Any, key: jax.Array, step: int):
        if self._future is not None:
            raise RuntimeError("AsyncRollout.produce called before settle() of the previous step")
        pending = state.pending
        if self._pending_step == step:
            batch, info = self.inner._place(pending), self._pending_info
        else:  # nothing graded ahead (a fresh run, or resumed from a checkpoint without a pending batch)
            state, batch, info = self.inner.produce(state.replace(pending=None), params, key, step)
        params, key = jax.tree.map(jnp.copy, (params, key))  # the train step donates the originals
        ahead = state.replace(pending=None)
        self._future = self._threads.submit(self.inner.produce, ahead, params, key, step + 1)
        self._pending_step = step + 1
        return state.replace(pending=pending), batch, info

    def settle(self, state: RolloutState) -> RolloutState:
        if self._future is None:
            return state
        nxt, batch, info = self._future.result()
        self._future = None
        self._pending_info = info
        return nxt.replace(pending=batch)

    def bind(self, frozen: Any) -> None:
        self.inner.bind(frozen)

    def host_state(self) -> dict:
        info = self._pending_info
        return {
            "pending_step": self._pending_step,
            "pending_info": None if info is None else {"metrics": info.metrics, "samples": info.samples},
        }

    def load_host_state(self, d: dict) -> None:
        self._pending_step = d.get("pending_step")
        info = d.get("pending_info")
        self._pending_info = (
            None if info is None else RolloutInfo(dict(info["metrics"]), list(info["samples"]))
        )

    def close(self) -> None:
        if self._future is not None:
            self._future.cancel()
        self._threads.shutdown(wait=True)


def make_rollout(cfg: RunConfig, *args, **kwargs) -> CodegenRollout | AsyncRollout:
    inner = CodegenRollout(cfg, *args, **kwargs)
    return AsyncRollout(inner) if cfg.rollout.async_rewards else inner
