"""The rollout of the code loop: ProblemSource (which problems) + a rollout engine (completions) + Grader
(rewards).

    rollout = make_rollout(cfg, tok, executor, problems, model, param_fn, ...)   # builds the three parts
    rollout.bind(frozen)                                            # the LoRA base (None: full fine-tuning)
    state = rollout.init_state(trainable_params)                    # RolloutState (checkpointed in RunState)
    state, batch, info = rollout.produce(state, params, key, step)  # the batch RL step `step` trains on
    ... train step ...
    state = rollout.settle(state)                                   # before logging / checkpointing

`params` are the trainable parameters after `step` updates, `key` the run's "rollout" stream (every random
choice of the step is a named key below it, `step_keys`), `info` the host metrics and logged samples. The
synchronous rollout's `settle` does nothing; `AsyncRollout` wraps the same interface one step ahead (its
`produce` returns the batch graded while the previous step trained), so the loop has no async branch.

One `produce` of CodegenRollout:
  1. pool push: every `pool.push_every` steps a snapshot of `params` enters the policy pool;
  2. problems: B − R fresh ones and R replayed successes (ProblemSource.draw);
  3. G completions per prompt (the rollout engine's generate, grpo_jax.rollout.engines); for a replayed
     problem the G-th member is replaced (on the device) by the stored success with its stored behaviour
     log-probs;
  4. tokens out, rewards in: the host decodes and the sandbox grades (Grader.grade);
  5. dynamic sampling (DAPO): groups whose rewards are all equal are refilled with fresh draws, at most
     `dynamic_max_rounds` extra rounds; the batch is gathered on the device from the kept rows; groups still
     missing are masked out (group_mask 0);
  6. the pool baseline b_pool(q) for the final prompts (grpo_jax.rollout.pool_runtime), if the objective uses
     it;
  7. the rollout state (ProblemSource.update): counts, curriculum, replay.
Prompts go to the device once per round and samples stay there; the host sees token ids and sends back
rewards and row indices.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import rng as rng_lib
from grpo_jax.codegen import pipeline
from grpo_jax.codegen.rewards import child_checked_fractions, failure_counts
from grpo_jax.policies import sampling
from grpo_jax.problem import Problem
from grpo_jax.rewards import registry as rewards_registry
from grpo_jax.rollout.engines import RolloutEngine, make_engine
from grpo_jax.rollout.grader import Grader, Grades, num_tests, parts_metrics
from grpo_jax.rollout.multiturn import MultiTurn, turn_metrics
from grpo_jax.rollout.pool_runtime import PoolRuntime
from grpo_jax.rollout.problem_source import GradedRound, ProblemSource
from grpo_jax.rollout.state import RolloutState
from grpo_jax.runtime import sharding
from grpo_jax.runtime.distributed import Context
from grpo_jax.runtime.memory import release_host_memory
from grpo_jax.tokenization import stop_ids
from grpo_jax.types import RolloutBatch, SampleOutput, batch_from_samples, empty_batch


@dataclasses.dataclass
class RolloutInfo:
    metrics: dict[str, float]  # host-side metrics of the rollout (timing, sandbox, curriculum, pool, replay)
    samples: list[dict]  # one logged sample per group (task, completion, status, reward)


class Rollout(Protocol):
    def init_state(self, params: Any) -> RolloutState: ...
    def produce(self, state, params, key, step: int) -> tuple[RolloutState, RolloutBatch, RolloutInfo]: ...
    def settle(self, state: RolloutState) -> RolloutState: ...
    def bind(self, frozen: Any) -> None: ...
    def host_state(self) -> dict: ...
    def load_host_state(self, d: dict) -> None: ...
    def close(self) -> None: ...


def kept(rewards: np.ndarray) -> np.ndarray:
    """[B] bool: groups whose rewards are not all equal (the ones with a GRPO signal; DAPO's filter)."""
    return np.ptp(rewards, axis=1) > 0


@dataclasses.dataclass
class Round:
    """One sampling round: B problems, their prompts and samples on the device, and the host's grades."""

    idx: np.ndarray  # [B] problem ids
    prompt: jax.Array  # [B, P] on the device
    pmask: jax.Array  # [B, P]
    out: SampleOutput  # [B, G, T] on the device
    grades: Grades
    replayed: np.ndarray  # [B] bool: the group's G-th member is a replayed success
    tokens: int
    t_sample: float
    turns: dict | None = None  # multi-turn counts (grpo_jax.rollout.multiturn.turn_metrics)
    engine: dict | None = None  # the engine's counts of the first turn's call (RolloutEngine.last_stats)

    def fresh(self) -> np.ndarray:
        """[B, G] 1 for freshly sampled members (a replayed G-th member is not fresh evidence)."""
        g = self.grades.rewards.shape[1]
        return np.where(self.replayed[:, None] & (np.arange(g) == g - 1)[None], 0.0, 1.0)


class CodegenRollout:
    """The synchronous rollout (see the module docstring): the composition of its three parts."""

    def __init__(
        self,
        source: ProblemSource,
        engine: RolloutEngine,
        grader: Grader,
        encode: Callable[[list[Problem]], tuple[np.ndarray, np.ndarray]],  # problems -> (prompt, mask) [B, P]
        *,
        group: int,
        sp: sampling.SamplingParams | None = None,
        dynamic_rounds: int = 0,
        pool: PoolRuntime | None = None,
        param_fn=None,
        ctx: Context | None = None,
        batch_sharding: Any = None,
        log_every: int = 1,
        turns: MultiTurn | None = None,
    ):
        self.source, self.engine, self.grader, self.encode = source, engine, grader, encode
        self.sp = sampling.sampling_params() if sp is None else sp
        self.turns = turns
        self.B, self.G, self.rounds, self.pool_rt = source.B, group, dynamic_rounds, pool
        self.param_fn, self.frozen, self.ctx = param_fn, None, ctx or Context()
        self.batch_sharding, self.log_every = batch_sharding, log_every

    def init_state(self, params: Any) -> RolloutState:
        """The rollout state of a fresh run; `params` (the trainable tree) shapes the pool's slots."""
        state = self.source.init_state()
        return dataclasses.replace(state, pool=None if self.pool_rt is None else self.pool_rt.init(params))

    def settle(self, state: RolloutState) -> RolloutState:
        return state

    def bind(self, frozen: Any) -> None:
        """The read-only parameters the rollout samples with (the LoRA base), known once the state exists."""
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

    def produce(self, state: RolloutState, params: Any, key: jax.Array, step: int):
        release_host_memory()  # what the last train step or evaluation freed, back to the OS
        keys, m = self.step_keys(key, step), {}
        pool = state.pool
        if self.pool_rt is not None:
            pool = self.pool_rt.maybe_push(pool, params, step, keys["pool_push_noise"])
            m.update(self.pool_rt.metrics(pool, step, with_diversity=step % self.log_every == 0))
        full = params if self.param_fn is None else self.param_fn(params, self.frozen)
        idx, replayed = self.source.draw(state, keys["problems"], keys["replay_draw"])
        rounds = [self.sample_and_grade(full, idx, keys["sample/0"], replayed)]
        if self.rounds:  # dynamic sampling: refill the all-equal groups
            m["dynamic/frac_zero_std_first_round"] = float(1.0 - kept(rounds[0].grades.train_rewards).mean())
            for r in range(1, self.rounds + 1):
                if sum(int(kept(x.grades.train_rewards).sum()) for x in rounds) >= self.B:
                    break
                extra, _ = self.source.draw(state, keys[f"refill_problems/{r}"])
                rounds.append(self.sample_and_grade(full, extra, keys[f"sample/{r}"]))
        batch, rows = assemble(rounds, self.B, self.G, dynamic=bool(self.rounds), m=m)
        if self.grader.rewards is not None:  # each reward's mean, std and share of the advantage
            parts = np.stack([rounds[ri].grades.parts[b] for ri, b in rows])  # type: ignore[index]
            m.update(parts_metrics(parts, self.grader.rewards))
            # the success rate of the TEST reward (the train step's reads the combined one; this replaces it)
            tests = np.stack([rounds[ri].grades.rewards[b] for ri, b in rows])
            gm = np.asarray(batch.group_mask)
            ok = (tests >= self.grader.rewards.success_threshold) * gm
            m["Performance/SuccessRate"] = float(ok.sum() / max(float(gm.sum()), 1.0))
        if self.pool_rt is not None and self.pool_rt.uses_baseline:
            probs = [self.source.problems[rounds[ri].idx[b]] for ri, b in rows]
            base, valid, pm = self.pool_rt.baseline(
                pool, self.frozen, keys, probs, batch.prompt, batch.prompt_mask, step
            )
            if base is not None:
                batch = dataclasses.replace(
                    batch, baseline=jnp.asarray(base), baseline_valid=jnp.asarray(valid)
                )
            m.update(pm)
        graded = [GradedRound(x.idx, x.grades.rewards, x.fresh(), x.out) for x in rounds]
        state, sm = self.source.update(dataclasses.replace(state, pool=pool), graded, replayed)
        m.update(sm)
        m.update(round_metrics(rounds))
        samples = [self.sample_row(rounds[ri], b) for ri, b in rows]
        return state, self.place(batch), RolloutInfo(m, samples)

    def place(self, x: Any) -> Any:
        """Host values or device arrays as global arrays split over the mesh's batch axes."""
        return (
            jax.tree.map(jnp.asarray, x)
            if self.batch_sharding is None
            else sharding.put(x, self.batch_sharding)
        )

    def sample_and_grade(self, params, idx: np.ndarray, key: jax.Array, replayed=None) -> Round:
        """Sample G completions for problems idx [B] on the device; decode and grade them on the host."""
        probs = [self.source.problems[i] for i in idx]
        host_prompt = self.encode(probs)
        prompt, pmask = self.place(host_prompt)  # the prompts' one trip to the device
        t0 = time.perf_counter()
        if self.turns is None:
            out, conv = self.engine.generate(params, prompt, pmask, key, n=self.G, sp=self.sp), None
        else:  # the later turns continue the first turn's conversations
            out, conv = self.engine.generate_kept(params, prompt, pmask, key, n=self.G, sp=self.sp)
        stats = dict(self.engine.last_stats)
        n_rep = 0 if replayed is None else int(replayed["problem"].shape[0])
        if n_rep:
            out = splice_replayed(out, replayed, n_rep)
        tokens, mask = self.ctx.host((out.tokens, out.mask))  # tokens out (every process: all rows)
        release_host_memory()  # the sampler's caches and weight copy, freed, back to the OS
        t1 = time.perf_counter()
        grades = self.grader.grade(probs, tokens, mask, first_turn=self.turns is not None)
        replayed_rows = np.arange(self.B) >= self.B - n_rep
        counts = None
        if self.turns is not None:  # later turns on the failed rows; the batch holds whole trajectories
            logp, trunc = self.ctx.host((out.logp, out.truncated))
            first = SampleOutput(tokens, logp, mask, mask.sum(-1).astype(np.int32), trunc)
            out, grades, counts, t_more = self.turns.run(
                params, probs, *host_prompt, first, grades, key, conv, self.sp
            )
            t1, mask = t1 + t_more, out.mask
        return Round(
            np.asarray(idx),
            prompt,
            pmask,
            out,
            grades,
            replayed_rows,
            int(mask.sum()),
            t1 - t0,
            counts,
            stats,
        )

    def sample_row(self, x: Round, b: int) -> dict:
        g = x.grades
        return {
            "task_id": self.source.problems[x.idx[b]].task_id,
            "completion": g.texts[b * self.G],
            "status": g.verdicts[b * self.G].status.value,
            "reward": float(g.train_rewards[b, 0]),
        }


def splice_replayed(out: SampleOutput, replayed: dict, n_rep: int) -> SampleOutput:
    """The G-th member of the last n_rep groups replaced (on the device) by the stored success with its
    stored behaviour log-probs."""
    at = (slice(out.tokens.shape[0] - n_rep, None), out.tokens.shape[1] - 1)
    # jnp.asarray: the engines give device arrays already (it returns them as they are)
    return SampleOutput(
        tokens=jnp.asarray(out.tokens).at[at].set(replayed["tokens"]),
        logp=jnp.asarray(out.logp).at[at].set(replayed["logp"]),
        mask=jnp.asarray(out.mask).at[at].set(replayed["mask"]),
        lengths=jnp.asarray(out.lengths).at[at].set(replayed["mask"].sum(-1).astype(jnp.int32)),
        truncated=jnp.asarray(out.truncated).at[at].set(replayed["truncated"]),
    )


def assemble(
    rounds: list[Round], B: int, G: int, *, dynamic: bool, m: dict
) -> tuple[RolloutBatch, list[tuple[int, int]]]:
    """The batch and its (round, row) sources: round 0 as it is, or (dynamic sampling) the kept groups of
    every round first, then round 0's all-equal groups as masked filler. Device arrays are gathered by row on
    the device; the dynamic-sampling counts go to `m`."""
    group_mask = np.ones((B, G), np.float32)
    rows = [(0, b) for b in range(B)]
    if dynamic:
        rows = [
            (ri, int(b)) for ri, x in enumerate(rounds) for b in np.flatnonzero(kept(x.grades.train_rewards))
        ]
        rows = rows[:B]
        n_kept = len(rows)
        rows += [(0, int(b)) for b in np.flatnonzero(~kept(rounds[0].grades.train_rewards))][: B - n_kept]
        group_mask = np.repeat((np.arange(B) < n_kept)[:, None], G, axis=1).astype(np.float32)
        m["dynamic/rounds"] = float(len(rounds) - 1)
        m["dynamic/kept_groups"] = float(n_kept)

    def pick(name):
        return np.stack([getattr(rounds[ri].grades, name)[b] for ri, b in rows])

    parts: dict[str, list[Any]] = {"prompt": [x.prompt for x in rounds], "pmask": [x.pmask for x in rounds]}
    parts.update({f: [getattr(x.out, f) for x in rounds] for f in SampleOutput._fields})
    if len(rounds) == 1 and rows == [(0, b) for b in range(B)]:
        dev = {k: v[0] for k, v in parts.items()}
    else:
        flat = jnp.asarray([ri * B + b for ri, b in rows], jnp.int32)
        dev = {k: jnp.concatenate(v)[flat] for k, v in parts.items()}
    out = SampleOutput(*(dev[f] for f in SampleOutput._fields))
    batch = batch_from_samples(
        dev["prompt"],
        dev["pmask"],
        out,
        pick("train_rewards"),
        group_mask=group_mask,
        test_rewards=pick("tests"),
        test_mask=pick("test_mask"),
    )
    return batch, rows


def round_metrics(rounds: list[Round]) -> dict[str, float]:
    """Timing, throughput and sandbox counts of a step's rounds."""
    verdicts = [v for x in rounds for v in x.grades.verdicts]
    t_s, t_r = sum(x.t_sample for x in rounds), sum(x.grades.seconds for x in rounds)
    m = {
        "time/sample_s": t_s,
        "time/reward_s": t_r,
        "throughput/sample_tokens_per_s": sum(x.tokens for x in rounds) / max(t_s, 1e-9),
        "rollout/sampled_tokens": float(sum(x.tokens for x in rounds)),  # the model's own tokens, all turns
        "sandbox/programs_per_s": len(verdicts) / max(t_r, 1e-9),  # result-cache hits included
        "sandbox/cache_hits": float(sum(v.cached for v in verdicts)),
    }
    m.update({f"sandbox/{k}": float(v) for k, v in failure_counts(verdicts).items()})
    m.update({f"sandbox/{k}": v for k, v in child_checked_fractions(verdicts).items()})
    m.update(turn_metrics([x.turns for x in rounds if x.turns is not None]))
    stats = [x.engine for x in rounds if x.engine]
    if stats:  # the first turn's sampling: the share of the row-steps decoded that no reply needed
        useful, computed = sum(s["useful_tokens"] for s in stats), sum(s["row_steps"] for s in stats)
        m["rollout/padding_fraction"] = 1.0 - useful / max(computed, 1.0)
        m["rollout/decode_steps"] = float(sum(s["decode_steps"] for s in stats))
    return m


class AsyncRollout:
    """The same interface, one step ahead: `produce(step)` returns the batch graded while step − 1 trained
    (or produces it now when there is none, e.g. the first step) and starts step + 1 in a worker thread from
    a copy of `params` (one step off-policy: the loss corrects it with --tis_cap); `settle` waits for that
    rollout and puts its batch into `state.pending`, so every checkpoint holds the graded next batch and a
    resumed run continues bit-identically. Pool snapshots are pushed from the policy that sampled (π_θ of
    the step before)."""

    def __init__(self, inner: CodegenRollout, batch_shape: tuple[int, int, int, int]):
        self.inner, self.batch_shape = inner, batch_shape  # (B, G, P, T)
        self._threads = ThreadPoolExecutor(max_workers=1)
        self._future: Future | None = None
        self._pending_step: int | None = None
        self._pending_info: RolloutInfo | None = None

    def init_state(self, params: Any) -> RolloutState:
        pending = empty_batch(*self.batch_shape, self.inner.grader.num_tests)
        return dataclasses.replace(self.inner.init_state(params), pending=pending)

    def produce(self, state: RolloutState, params: Any, key: jax.Array, step: int):
        if self._future is not None:
            raise RuntimeError("AsyncRollout.produce called before settle() of the previous step")
        pending = state.pending
        if self._pending_step == step:
            batch, info = self.inner.place(pending), self._pending_info
        else:  # nothing graded ahead (a fresh run, or resumed from a checkpoint without a pending batch)
            state, batch, info = self.inner.produce(
                dataclasses.replace(state, pending=None), params, key, step
            )
        params, key = jax.tree.map(jnp.copy, (params, key))  # the train step donates the originals
        self._future = self._threads.submit(
            self.inner.produce, dataclasses.replace(state, pending=None), params, key, step + 1
        )
        self._pending_step = step + 1
        return dataclasses.replace(state, pending=pending), batch, info

    def settle(self, state: RolloutState) -> RolloutState:
        if self._future is None:
            return state
        nxt, batch, info = self._future.result()
        self._future = None
        self._pending_info = info
        return dataclasses.replace(nxt, pending=batch)

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


def make_grader(cfg, tok, executor, num_tests: int, ctx=None, owned=None) -> Grader:
    """The training rollout's Grader: the sandbox settings and the --rewards functions of the RunConfig."""
    rewards = rewards_registry.from_config(cfg)
    return Grader(
        executor,
        cfg.sandbox,
        tok,
        cfg.tasks.prompt,
        group=cfg.rollout.group_size,
        num_tests=num_tests,
        ctx=ctx,
        owned=owned,
        rewards=rewards,
    )


def make_rollout(cfg, tok, executor, problems, model_cfg, param_fn=None, *, ctx=None, batch_sharding=None):
    """The run's rollout from its config sections: a ProblemSource (tasks, curriculum, replay), the rollout
    engine (--rollout_engine, rollout), a Grader (sandbox, --rewards) and, with a pool, its PoolRuntime
    (pool); async with --async_rewards. `cfg` is the RunConfig; none of the three parts sees it."""
    ro, fmt = cfg.rollout, cfg.tasks.prompt
    # the procedural suite's training levels; other sources (MBPP, CodeI/O, files) are one level, 0
    levels = cfg.tasks.rl_levels if cfg.tasks.source == "procedural" else (0,)
    source = ProblemSource(
        problems,
        levels,
        cfg.curriculum,
        cfg.replay,
        prompts_per_step=ro.prompts_per_step,
        max_new_tokens=ro.max_new_tokens,
    )
    owned = None if batch_sharding is None else sharding.owned_rows(ro.prompts_per_step, batch_sharding)
    m = num_tests(problems)
    grader = make_grader(cfg, tok, executor, m, ctx, owned)
    engine = make_engine(
        ro.engine,
        model_cfg,
        max_new=ro.max_new_tokens,
        eos_ids=stop_ids(tok),
        pad_id=tok.pad_id,
        weights_dtype=ro.rollout_dtype,
        slots=ro.engine_slots,
        chunk=ro.engine_chunk,
    )
    pool = None
    if cfg.pool.enabled:
        pool_grader = Grader(executor, cfg.sandbox, tok, fmt, group=cfg.pool.samples_per_member, num_tests=m)
        pool = PoolRuntime(
            cfg.pool,
            ro,
            model_cfg,
            tok,
            pool_grader,
            uses_baseline=cfg.objective.baseline != "group",
            lora_alpha=cfg.lora.alpha if cfg.lora.enabled else None,
        )

    def encode(probs):
        return pipeline.encode_prompts(tok, probs, cfg.tasks.prompt_len, fmt)

    rounds = ro.dynamic_max_rounds if ro.dynamic_sampling else 0
    turns = None
    if ro.max_turns > 1:
        turns = MultiTurn.from_rollout(engine, grader, tok, fmt, ro)
    inner = CodegenRollout(
        source,
        engine,
        grader,
        encode,
        group=ro.group_size,
        sp=sampling.sampling_params(ro.temperature, ro.top_k, ro.top_p),
        dynamic_rounds=rounds,
        pool=pool,
        param_fn=param_fn,
        ctx=ctx,
        batch_sharding=batch_sharding,
        log_every=cfg.log.every,
        turns=turns,
    )
    if not ro.async_rewards:
        return inner
    shape = (ro.prompts_per_step, ro.group_size, cfg.tasks.prompt_len, ro.completion_len)
    return AsyncRollout(inner, shape)
