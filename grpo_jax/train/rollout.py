"""The device/host boundary of the code-generation loop: problems -> sampled groups -> sandbox -> GRPOBatch.

One call of `RolloutWorker.produce(view, step)` makes the batch that GRPO step `step` trains on:

  1. problems: B − R fresh ones (uniform, or the curriculum's P(q), grpo_jax.curriculum) and R = round(
     replay_fraction · B) drawn from the prioritized replay buffer (grpo_jax.replay) when it holds any;
  2. G completions per prompt from the sampling parameters in `view` (the "sample" stream of the step);
     for a replayed problem the G-th member is replaced by the stored successful completion, with its stored
     behaviour log-probs (the loss corrects it with truncated importance sampling, `--tis_cap`);
  3. the sandbox grades every completion: all-pass rewards [B, G] and per-test results [B, G, M];
  4. dynamic sampling (DAPO): groups whose rewards are all equal are dropped and refilled with fresh draws,
     at most `dynamic_max_rounds` extra rounds; groups still missing are masked out (group_mask 0);
  5. the pool baseline b_pool(q) for the final prompts (grpo_jax.train.pool_host), if the objective uses it;
  6. state updates that depend only on this rollout: curriculum pass rates (every graded fresh sample),
     replay insertions (the first success of each fresh group; priority (1 − s(q) + eps)^alpha) and the
     priorities of the items replayed (re-scored with the updated s(q)).

Everything random is a function of (rng streams, step): `view` carries the streams and the rollout of step s
uses fold_in(stream, s), exactly `TrainState.key` at step s. With the default options (uniform problems, no
replay, no dynamic sampling) this is the loop of the first version, bit for bit.

Async (`--async_rewards`): the loop calls `produce` for step t+1 in a worker thread while the device trains
on step t, from a view holding a COPY of π_θ_t (one step off-policy; the stored sampler log-probs make the
TIS correction exact).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import curriculum, replay
from grpo_jax.codegen import pipeline
from grpo_jax.codegen.problem import Problem
from grpo_jax.codegen.rewards import failure_counts, per_test_rewards
from grpo_jax.codegen.tokenizer import CodeTokenizer
from grpo_jax.policies import sampling
from grpo_jax.sandbox.executor import Executor
from grpo_jax.train.step import GRPOBatch, batch_from_samples


@dataclasses.dataclass
class RolloutView:
    """What a rollout reads: sampling parameters (full model), PRNG streams and the rollout-side states."""

    params: Any
    rng: dict[str, jax.Array]
    curriculum: Any
    replay: Any
    pool: Any = None
    frozen: Any = None


@dataclasses.dataclass
class Rollout:
    batch: GRPOBatch
    curriculum: Any  # updated states
    replay: Any
    metrics: dict[str, float]
    samples: list[dict]  # one logged sample per group (task, completion, status, reward)
    passes: list[tuple[str, bool]]  # (task id, passed) of every graded fresh sample (pass-rate table)


def _key(rng: dict, stream: str, step: int) -> jax.Array:
    return jax.random.fold_in(rng[stream], step)


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


def kept(graded: dict) -> np.ndarray:
    """[B] bool: groups whose rewards are not all equal (the ones with a GRPO signal; DAPO's filter)."""
    return np.ptp(graded["rewards"], axis=1) > 0


class RolloutWorker:
    def __init__(
        self, cfg, tok: CodeTokenizer, executor: Executor, problems: Sequence[Problem], pool_rt=None
    ):
        self.cfg, self.tok, self.executor, self.problems = cfg, tok, executor, list(problems)
        self.pool_rt = pool_rt
        self.G, self.B = cfg.rollout.group_size, cfg.prompts_per_step
        lv = sorted(set(cfg.rl_levels))
        self.levels = jnp.asarray(
            [lv.index(p.level) if p.level in lv else 0 for p in self.problems], jnp.int32
        )
        self.num_levels = len(lv)
        self.num_tests = max(1, max(len(p.tests) for p in self.problems))
        self.sp = sampling.sampling_params(cfg.rollout.temperature, cfg.rollout.top_k, cfg.rollout.top_p)
        self.sampler = sampling.make_sampler(
            cfg.model, group=self.G, max_new=cfg.rollout.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id
        )
        self.ccfg = cfg.curriculum
        self._cur_sample = jax.jit(curriculum.sample, static_argnums=(1, 4))
        self._cur_update = jax.jit(curriculum.update, static_argnums=1)
        self._cur_probs = jax.jit(curriculum.probabilities, static_argnums=1)
        self._rp_add = jax.jit(replay.add)
        self._rp_sample = jax.jit(replay.sample, static_argnums=2)
        self._rp_update = jax.jit(replay.update_priorities)
        self.n_replay = int(round(cfg.replay_fraction * self.B)) if cfg.replay_fraction > 0 else 0

    # ---- initial states
    def init_curriculum(self):
        return curriculum.init(np.asarray(self.levels), self.num_levels, self.ccfg)

    def init_replay(self):
        if self.n_replay == 0:
            return None
        return replay.init(replay_template(self.cfg.rollout.max_new_tokens), self.cfg.replay_capacity)

    # ---- one rollout
    def _choose(self, view: RolloutView, key: jax.Array, n: int) -> np.ndarray:
        if self.ccfg.kind == "uniform":  # the first version's draw, kept bit for bit
            return np.asarray(jax.random.choice(key, len(self.problems), (self.B,), replace=False))[:n]
        return np.asarray(self._cur_sample(view.curriculum, self.ccfg, self.levels, key, self.B))[:n]

    def _sample_and_grade(self, view, idx, key, replayed=None):
        """Sample G completions for problems idx [B]; grade. Returns a dict of numpy arrays + verdicts."""
        probs = [self.problems[i] for i in idx]
        prompt, pmask = pipeline.encode_prompts(self.tok, probs, self.cfg.prompt_len)
        t0 = time.perf_counter()
        out = self.sampler(view.params, jnp.asarray(prompt), jnp.asarray(pmask), key, self.sp)
        g = {
            "tokens": np.array(out.tokens),
            "mask": np.array(out.mask),
            "logp": np.array(out.logp),
            "truncated": np.array(out.truncated),
        }
        n_rep = 0 if replayed is None else len(replayed["problem"])
        if n_rep:  # the G-th member of the last n_rep groups is the stored success
            for name in ("tokens", "mask", "logp", "truncated"):
                g[name][self.B - n_rep :, self.G - 1] = np.asarray(replayed[name])
        t1 = time.perf_counter()
        texts = pipeline.decode_completions(self.tok, g["tokens"], g["mask"])
        verdicts, rewards = pipeline.score_completions(
            self.executor, probs, texts, self.G, self.cfg.sandbox_deadline_s
        )
        n_tests = [len(p.tests) for p in probs for _ in range(self.G)]
        tv, tm = per_test_rewards(verdicts, self.num_tests, n_tests)
        g.update(
            idx=np.asarray(idx),
            prompt=prompt,
            pmask=pmask,
            rewards=rewards,
            tests=tv.reshape(self.B, self.G, self.num_tests),
            test_mask=tm.reshape(self.B, self.G, self.num_tests)[:, 0],
            texts=texts,
            verdicts=verdicts,
            replayed=np.arange(self.B) >= self.B - n_rep,
            t_sample=t1 - t0,
            t_reward=time.perf_counter() - t1,
        )
        return g

    def produce(self, view: RolloutView, step: int) -> Rollout:
        cfg, B, G = self.cfg, self.B, self.G
        data_key, sample_key = _key(view.rng, "data", step), _key(view.rng, "sample", step)
        m: dict[str, float] = {}
        # 1. problems (fresh + replayed)
        replayed, n_rep = None, 0
        if self.n_replay and float(replay.total(view.replay)) > 0:
            n_rep = self.n_replay
            ridx, replayed, _ = self._rp_sample(view.replay, jax.random.fold_in(data_key, 1000), n_rep)
            replayed = {**jax.device_get(replayed), "slot": np.asarray(ridx)}
        idx = self._choose(view, data_key, B - n_rep)
        if n_rep:
            idx = np.concatenate([idx, np.asarray(replayed["problem"])])
        rounds = [self._sample_and_grade(view, idx, sample_key, replayed)]
        # 4. dynamic sampling: refill all-equal groups
        if cfg.dynamic_sampling:
            m["dynamic/frac_zero_std_first_round"] = float(1.0 - kept(rounds[0]).mean())
            for r in range(1, cfg.dynamic_max_rounds + 1):
                if sum(int(kept(x).sum()) for x in rounds) >= B:
                    break
                extra = self._choose(view, jax.random.fold_in(data_key, r), B)
                rounds.append(self._sample_and_grade(view, extra, jax.random.fold_in(sample_key, r)))
            rows = [(ri, b) for ri, x in enumerate(rounds) for b in np.flatnonzero(kept(x))][:B]
            n_kept = len(rows)
            fill = [(0, b) for b in np.flatnonzero(~kept(rounds[0]))][: B - n_kept]
            rows += fill
            group_mask = np.repeat((np.arange(B) < n_kept)[:, None], G, axis=1).astype(np.float32)
            m["dynamic/rounds"] = float(len(rounds) - 1)
            m["dynamic/kept_groups"] = float(n_kept)
        else:
            rows = [(0, b) for b in range(B)]
            group_mask = np.ones((B, G), np.float32)

        def pick(name):
            return np.stack([rounds[ri][name][b] for ri, b in rows])

        fields = ("tokens", "mask", "logp", "truncated", "prompt", "pmask", "rewards", "tests", "test_mask")
        sel = {k: pick(k) for k in fields}
        sel_idx = np.array([rounds[ri]["idx"][b] for ri, b in rows])
        sel_probs = [self.problems[i] for i in sel_idx]
        # 5. pool baseline for the final prompts
        pool_b = pool_valid = None
        if self.pool_rt is not None and view.pool is not None:
            pool_b, pool_valid, pm = self.pool_rt.baseline(
                view.pool,
                view.frozen,
                sample_key,
                self.executor,
                sel_probs,
                sel["prompt"],
                sel["pmask"],
                step,
            )
            m.update(pm)
        out = sampling.SampleOutput(
            jnp.asarray(sel["tokens"]),
            jnp.asarray(sel["logp"]),
            jnp.asarray(sel["mask"]),
            jnp.asarray(sel["mask"].sum(-1).astype(np.int32)),
            jnp.asarray(sel["truncated"]),
        )
        batch = batch_from_samples(
            sel["prompt"],
            sel["pmask"],
            out,
            sel["rewards"],
            group_mask=group_mask,
            baseline=pool_b,
            baseline_valid=pool_valid,
            test_rewards=sel["tests"],
            test_mask=sel["test_mask"],
        )
        # 6. curriculum (every graded fresh sample), replay
        all_idx, passes, counts, pass_log = [], [], [], []
        for x in rounds:
            fresh = np.where(x["replayed"][:, None] & (np.arange(G) == G - 1)[None], 0.0, 1.0)  # [B, G]
            all_idx.append(x["idx"])
            counts.append(fresh.sum(1).astype(np.int32))
            passes.append((x["rewards"] * fresh).sum(1) / np.maximum(fresh.sum(1), 1))
            for b in range(B):
                for j in range(G):
                    if fresh[b, j]:
                        tid = self.problems[x["idx"][b]].task_id
                        pass_log.append((tid, bool(x["verdicts"][b * G + j].passed)))
        cur = self._cur_update(
            view.curriculum,
            self.ccfg,
            self.levels,
            jnp.asarray(np.concatenate(all_idx)),
            jnp.asarray(np.concatenate(passes), jnp.float32),
            jnp.asarray(np.concatenate(counts)),
        )
        rp = view.replay
        if self.n_replay:
            rp, rm = self._update_replay(rp, cur, rounds, replayed)
            m.update(rm)
        m.update({k: float(v) for k, v in jax.device_get(curriculum.level_rates(cur)).items()})
        seen = np.asarray(cur.attempts) > 0
        m["curriculum/mean_pass_rate_seen"] = (
            float(np.asarray(cur.pass_rate)[seen].mean()) if seen.any() else 0.0
        )
        # timing / sandbox metrics (all rounds)
        verdicts = [v for x in rounds for v in x["verdicts"]]
        t_s, t_r = sum(x["t_sample"] for x in rounds), sum(x["t_reward"] for x in rounds)
        n_tok = float(sum(x["mask"].sum() for x in rounds))
        m.update(
            {
                "time/sample_s": t_s,
                "time/reward_s": t_r,
                "throughput/sample_tokens_per_s": n_tok / max(t_s, 1e-9),
                "sandbox/programs_per_s": len(verdicts) / max(t_r, 1e-9),  # result-cache hits included
                "sandbox/cache_hits": float(sum(v.cached for v in verdicts)),
            }
        )
        m.update({f"sandbox/{k}": float(v) for k, v in failure_counts(verdicts).items()})
        samples = []
        for ri, b in rows:
            x = rounds[ri]
            samples.append(
                {
                    "task_id": self.problems[x["idx"][b]].task_id,
                    "completion": x["texts"][b * G],
                    "status": x["verdicts"][b * G].status.value,
                    "reward": float(x["rewards"][b, 0]),
                }
            )
        return Rollout(batch, cur, rp, m, samples, pass_log)

    def _update_replay(self, rp, cur, rounds, replayed):
        """Insert the first success of every fresh group; refresh the priorities of the replayed items."""
        s = np.asarray(cur.pass_rate)
        a = self.cfg.replay_alpha
        m = {}
        for x in rounds:
            succ = (x["rewards"] >= 1.0) & ~(x["replayed"][:, None] & (np.arange(self.G) == self.G - 1)[None])
            has = succ.any(1)
            first = np.argmax(succ, axis=1)
            b = np.arange(self.B)
            items = {
                "problem": jnp.asarray(x["idx"], jnp.int32),
                "tokens": jnp.asarray(x["tokens"][b, first]),
                "mask": jnp.asarray(x["mask"][b, first]),
                "logp": jnp.asarray(x["logp"][b, first]),
                "truncated": jnp.asarray(x["truncated"][b, first]),
            }
            prio = replay.success_priority(jnp.ones(self.B), jnp.asarray(s[x["idx"]]), alpha=a)
            rp = self._rp_add(rp, items, prio, jnp.asarray(has))
        if replayed is not None:
            slots = jnp.asarray(replayed["slot"])
            prio = replay.success_priority(
                jnp.ones(len(replayed["slot"])), jnp.asarray(s[np.asarray(replayed["problem"])]), alpha=a
            )
            rp = self._rp_update(rp, slots, prio)
            x = rounds[0]
            m["replay/replayed_groups"] = float(len(replayed["slot"]))
            m["replay/replayed_reward"] = float(x["rewards"][x["replayed"], self.G - 1].mean())
        m["replay/size"] = float(rp.size)
        m["replay/total_priority"] = float(replay.total(rp))
        return rp, m


def empty_batch(b: int, g: int, p: int, t: int, num_tests: int) -> GRPOBatch:
    """A zero GRPOBatch of the given shapes (restore template of a pending async rollout)."""
    out = sampling.SampleOutput(
        jnp.zeros((b, g, t), jnp.int32),
        jnp.zeros((b, g, t), jnp.float32),
        jnp.zeros((b, g, t), jnp.float32),
        jnp.zeros((b, g), jnp.int32),
        jnp.zeros((b, g), bool),
    )
    return batch_from_samples(
        np.zeros((b, p), np.int32),
        np.zeros((b, p), np.int32),
        out,
        np.zeros((b, g), np.float32),
        baseline=np.zeros((b,), np.float32),
        baseline_valid=np.zeros((b,), np.float32),
        test_rewards=np.zeros((b, g, num_tests), np.float32),
        test_mask=np.zeros((b, num_tests), np.float32),
    )
