"""How completions are generated: the second of the rollout's three parts (ProblemSource, Sampler, Grader).

    sampler.generate(params, prompt, prompt_mask, key) -> SampleOutput     # [B, P] prompts -> [B, G, T]

`KVCacheSampler` is the JAX KV-cache sampler of the policy (grpo_jax.policies.sampling: G completions per
prompt from one encoding of the prompt, temperature / top-k / top-p as data); `MemberSampler` (the policy
pool's members, grpo_jax.train.pool_host) is another implementation, and a different engine (a faster decoder,
a multi-turn loop that continues a conversation) plugs in here without touching the rest of the rollout.
The behaviour log-probs in SampleOutput.logp are those of the distribution actually sampled.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from grpo_jax import rng as rng_lib
from grpo_jax.config import RolloutConfig
from grpo_jax.policies import continuation, sampling
from grpo_jax.tokenization import stop_ids
from grpo_jax.train import compile_cache
from grpo_jax.train.logging import release_host_memory
from grpo_jax.types import SampleOutput


class Sampler(Protocol):
    """Anything that turns prompts into G completions each."""

    def generate(
        self, params: Any, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array
    ) -> SampleOutput: ...


class KVCacheSampler:
    """The policy's own sampler: `group` completions of at most `max_new_tokens` per prompt, stopping at any
    of `eos_ids` (one compiled while-loop; the sampling parameters are data). For multi-turn trajectories
    (grpo_jax.train.multiturn) it also keeps the first turn's KV cache and continues the conversations from it
    (grpo_jax.policies.continuation)."""

    def __init__(self, model, ro: RolloutConfig, *, eos_ids: tuple[int, ...], pad_id: int):
        self.params = sampling.sampling_params(ro.temperature, ro.top_k, ro.top_p)
        kw = dict(max_new=ro.max_new_tokens, eos_id=eos_ids, pad_id=pad_id, weights_dtype=ro.rollout_dtype)
        self._fn = sampling.make_sampler(model, group=ro.group_size, **kw)
        self._cached = sampling.make_sampler(model, group=ro.group_size, with_cache=True, **kw)
        self._continue = continuation.make_continuer(model, **kw)

    def generate(
        self, params: Any, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array
    ) -> SampleOutput:
        return self._fn(params, prompt, prompt_mask, key, self.params)

    def generate_cached(self, params: Any, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array):
        """`generate` that also returns the final KV cache, which a multi-turn trajectory's later turns
        continue: (SampleOutput, KVCache)."""
        return self._cached(params, prompt, prompt_mask, key, self.params)

    def continue_from_cache(self, params: Any, rc, tokens: jax.Array, mask: jax.Array, key: jax.Array):
        """A feedback turn [R, F] appended to cached conversations (a continuation.RowCache) and the next
        reply sampled: (SampleOutput [R, 1, T], the RowCache after it)."""
        return self._continue.extend_decode(params, rc, tokens, mask, key, self.params)

    def continue_from_tokens(self, params: Any, ctx: jax.Array, ctx_mask: jax.Array, key: jax.Array):
        """The next reply after conversations given as left-padded token contexts [R, S] (encoded here)."""
        return self._continue.from_tokens(params, ctx, ctx_mask, key, self.params)


def eval_sampler(run, params, key):
    """sample_fn(prompt, pmask, n, greedy) of grpo_jax.codegen.pipeline.evaluate for the run's policy
    `params` (train.loop.evaluate; experiments.evaluate): call i uses key (key, i); one compiled sampler per
    group size for the whole run (run.eval_samplers); a bfloat16 policy samples from its bf16 weight copy
    (sampling.policy_weights_dtype). After each call the freed host memory goes back to the OS
    (logging.release_host_memory): every prompt-length bucket is a new sampler shape. The batches come in
    order of length (pipeline.plan_batches), so when the persistent compilation cache is on, the executable
    of the previous bucket is dropped as the next begins (~85-170 MB each for SmolLM2; they used to pile
    up until the end of the evaluation, which set the peak RSS of a `smollm2.flags` run)."""
    ro = run.cfg.rollout
    sp_sampled = sampling.sampling_params(ro.temperature, ro.top_k, ro.top_p)
    sp_greedy = sampling.sampling_params(0.0)
    calls = [0]
    shapes: dict[int, tuple] = {}  # group size -> the prompt shape of its last call

    def fn(prompt, pmask, n, greedy):
        calls[0] += 1
        if n not in run.eval_samplers:
            kw = dict(max_new=ro.max_new_tokens, eos_id=stop_ids(run.tok), pad_id=run.tok.pad_id)
            wd = sampling.policy_weights_dtype(run.model)
            run.eval_samplers[n] = sampling.make_sampler(run.model, group=n, weights_dtype=wd, **kw)
        sampler = run.eval_samplers[n]
        if shapes.get(n, prompt.shape) != prompt.shape and compile_cache.directory() is not None:
            sampler.clear_cache()  # a new bucket: the last one's executable is not needed again here
        shapes[n] = prompt.shape
        k = rng_lib.derive(key, calls[0])
        out = sampler(params, jnp.asarray(prompt), jnp.asarray(pmask), k, sp_greedy if greedy else sp_sampled)
        host = run.ctx.host((out.tokens, out.mask))
        release_host_memory()
        return host

    return fn


class EvalProgress:
    """Progress lines of an evaluation with elapsed time and an ETA: per sampler batch (`sampler` wraps a
    pipeline.SampleFn; one line at the first batch, at each tenth and at the last) and per graded chunk
    (`start` / `tick`, experiments.evaluate's chunked grading). Also sums the seconds spent sampling and
    grading. `write`: where the lines go (default stderr); `quiet_s`: no line before that many seconds since
    the first batch began (the main job's evaluations: a short one prints nothing)."""

    def __init__(self, n_batches: int, write=None, quiet_s: float = 0.0):
        self.batches = n_batches  # the sampler calls per pass (pipeline.plan_batches)
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.quiet_s, self.t_first = quiet_s, None
        self.what = "greedy"
        self.phase: tuple | None = None
        self.seconds = {"sampling": 0.0, "grading": 0.0}

    def start(self, phase: str, total: int, unit: str) -> None:
        self.phase = (phase, self.what)
        self.total, self.unit, self.done, self.t0 = total, unit, 0, time.perf_counter()
        self.t_first = self.t0 if self.t_first is None else self.t_first
        self.every = max(1, total // 10)

    def tick(self, done: int, seconds: float, kind: str) -> None:
        prev, self.done = self.done, done
        self.seconds[kind] += seconds
        now = time.perf_counter()
        if now - self.t_first < self.quiet_s:
            return
        if done == self.total or done == 1 or done // self.every != prev // self.every:
            el = now - self.t0
            eta = el / done * (self.total - done) if done else float("nan")
            self.write(
                f"[{self.phase[0]} {self.phase[1]}] {done}/{self.total} {self.unit}, {el:.1f} s, "
                f"ETA {eta:.0f} s"
            )

    def sampler(self, fn):
        """fn (pipeline.SampleFn) with a progress line per batch."""

        def sample(prompt, pmask, n, greedy):
            what = "greedy" if greedy else f"{n} samples/task"
            if self.phase != ("sampling", what):
                self.what = what
                self.start("sampling", self.batches, "batches")
            t = time.perf_counter()
            out = fn(prompt, pmask, n, greedy)
            self.tick(self.done + 1, time.perf_counter() - t, "sampling")
            return out

        return sample


def release_samplers(run) -> None:
    """Before an evaluation, with the persistent compilation cache on: drop every sampler's executable,
    the training rollout's included (it is loaded back from the cache at the next rollout, in seconds), so
    that the evaluation's own samplers do not sit on top of it (sampling.release_compiled). Not with
    --async_rewards, whose next rollout may be running."""
    if compile_cache.directory() is None or run.cfg.rollout.async_rewards:
        return
    sampling.release_compiled()
    release_host_memory()


def release_eval_samplers(run) -> None:
    """After an evaluation: drop its compiled samplers (one executable per prompt-length bucket, ~85 MB of
    host memory each for SmolLM2 with 30 unrolled layers) when the persistent compilation cache is on, so
    the next evaluation loads them back from it in seconds; without the cache they are kept (compiling one
    takes ~30 s). The freed memory goes back to the OS."""
    if compile_cache.directory() is None:
        return
    for fn in run.eval_samplers.values():
        fn.clear_cache()
    release_host_memory()
