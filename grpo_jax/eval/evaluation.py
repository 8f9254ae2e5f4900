"""One evaluation of a policy on a problem set, through a rollout engine: what the main job's held-out
evaluation (grpo_jax.train.heldout.evaluate) and `experiments.evaluate` both run.

    spec = EvalSpec(n_samples=8, ks=(1, 8), batch=16, max_new_tokens=512, ...)
    metrics = evaluate(policy, engine, executor, problems, key, spec, progress=..., details=...)

Per task the greedy completion and `n_samples` samples at the spec's temperature / top-k / top-p, in the
batches of codegen.pipeline.plan_batches (a fixed prompt width, or batches bucketed by prompt length); call i
of the sampler draws with derive(key, i), later turns (spec.max_turns > 1: execution feedback,
grpo_jax.rollout.multiturn.EvalTurns) with derive(key, "turns"). Grading, pass@k and the per-turn figures are
codegen.pipeline.evaluate's; `details` receives what they were computed from (the per-task records of
grpo_jax.eval.results).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from grpo_jax import atomic
from grpo_jax import rng as rng_lib
from grpo_jax.codegen import pipeline
from grpo_jax.policies import sampling
from grpo_jax.rollout.grader import GradeLimits
from grpo_jax.rollout.multiturn import EvalTurns
from grpo_jax.runtime import compile_cache
from grpo_jax.runtime.memory import release_host_memory


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """How a problem set is evaluated: the sampling (greedy + `n_samples` at temperature / top-k / top-p, up
    to `max_new_tokens`), pass@k's ks, the batches (`batch` prompts per sampler call; `prompt_len` a fixed
    width, None: bucketed by length with at most `max_batch_tokens` prompt positions per batch), multi-turn
    feedback (`max_turns`, `feedback_tokens`, `turn_discount`) and the sandbox's deadline and
    stop-on-failure."""

    n_samples: int
    ks: tuple[int, ...]
    batch: int
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    prompt_len: int | None = None
    max_batch_tokens: int | None = None
    max_turns: int = 1
    feedback_tokens: int = 128
    turn_discount: float = 1.0
    deadline_s: float | None = None
    stop_on_failure: bool = False

    def sampled(self) -> sampling.SamplingParams:
        return sampling.sampling_params(self.temperature, self.top_k, self.top_p)

    def greedy_only(self) -> EvalSpec:
        """Greedy pass@1 alone, one turn, prompts bucketed by length (the main job's extra problem sets)."""
        return dataclasses.replace(self, n_samples=0, ks=(), prompt_len=None, max_turns=1)


class Policy(NamedTuple):
    """What is evaluated: its parameters (the model's effective ones: LoRA merged), its tokenizer, how its
    prompts are rendered, and how device arrays reach this host (`host`: runtime.distributed.Context.host,
    or jax.device_get)."""

    params: Any
    tok: Any
    fmt: pipeline.PromptFormat
    host: Any


class SampleStore:
    """Each sampler call's tokens and mask on disk (call i: `directory`/i.npz, written atomically), and with
    execution feedback the call's later turns (i.turns.json: the turn each sample passed at, its later
    turns as text), so that an evaluation stopped part way resumes at its first missing call: the calls
    before it are read back, not sampled again (the same tokens: call i draws with derive(key, i), its later
    turns with derive(turns key, i), whatever ran before). The directory must belong to one evaluation
    identity (its caller names it so: grpo_jax.train.heldout)."""

    def __init__(self, directory: str):
        self.directory, self.hits = directory, 0

    def _path(self, i: int) -> str:
        return os.path.join(self.directory, f"{i}.npz")

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        try:
            with np.load(self._path(i)) as z:
                out = (z["tokens"], z["mask"])
        except (OSError, ValueError, KeyError):  # absent, or unreadable: sampled again
            return None
        self.hits += 1
        return out

    def put(self, i: int, tokens, mask) -> None:
        buf = io.BytesIO()
        np.savez(buf, tokens=np.asarray(tokens), mask=np.asarray(mask))
        self._write(self._path(i), buf.getvalue())

    def _write(self, path: str, data: bytes) -> None:
        os.makedirs(self.directory, exist_ok=True)
        atomic.write_bytes(path, data)

    def get_turns(self, i: int) -> tuple[np.ndarray, list] | None:
        """The later turns of call i's samples (EvalTurns), or None (`hits` counts sampler calls only)."""
        try:
            with open(os.path.join(self.directory, f"{i}.turns.json")) as f:
                d = json.load(f)
            return np.asarray(d["passed_turn"], np.int64), d["later"]
        except (OSError, ValueError, KeyError):
            return None

    def put_turns(self, i: int, passed_turn, later) -> None:
        d = {"passed_turn": np.asarray(passed_turn).tolist(), "later": later}
        text = json.dumps(d, default=lambda x: x.item() if isinstance(x, np.generic) else str(x))
        self._write(os.path.join(self.directory, f"{i}.turns.json"), text.encode())


def sample_fn(
    policy: Policy, engine, key, spec: EvalSpec, store: SampleStore | None = None
) -> pipeline.SampleFn:
    """sample_fn(prompt, pmask, n, greedy) of codegen.pipeline.evaluate over `engine`: call i draws with
    derive(key, i) (or reads call i back from `store`, and writes each call it draws there). After each call
    the freed host memory goes back to the OS (every prompt-length bucket is a new sampler shape); with the
    persistent compilation cache on, the previous bucket's executables are dropped as the next begins (they
    come back from the cache in seconds; ~85-170 MB each for SmolLM2)."""
    modes = {True: sampling.sampling_params(0.0), False: spec.sampled()}
    calls = [0]
    shapes: dict[int, tuple] = {}  # group size -> the prompt shape of its last call

    def fn(prompt, pmask, n, greedy):
        calls[0] += 1
        stored = None if store is None else store.get(calls[0])
        if stored is not None:
            return stored
        if shapes.get(n, prompt.shape) != prompt.shape and compile_cache.directory() is not None:
            engine.release()  # a new bucket: the last one's executables are not needed again here
        shapes[n] = prompt.shape
        k = rng_lib.derive(key, calls[0])
        out = engine.generate(
            policy.params, jnp.asarray(prompt), jnp.asarray(pmask), k, n=n, sp=modes[greedy]
        )
        host = policy.host((out.tokens, out.mask))
        release_host_memory()
        if store is not None:
            store.put(calls[0], *host)
        return host

    return fn


def eval_turns(
    policy: Policy, engine, executor, key, spec: EvalSpec, store: SampleStore | None = None
) -> EvalTurns | None:
    """The later turns of an evaluation with spec.max_turns > 1 (None for one turn); `store` keeps each
    call's later turns (and gives back those of an earlier attempt)."""
    if spec.max_turns <= 1:
        return None
    return EvalTurns(
        engine,
        policy.tok,
        policy.fmt,
        executor,
        GradeLimits(spec.deadline_s, spec.stop_on_failure),
        policy.params,
        rng_lib.derive(key, "turns"),
        sampled=spec.sampled(),
        max_turns=spec.max_turns,
        feedback_tokens=spec.feedback_tokens,
        discount=spec.turn_discount,
        store=store,
    )


def spec_from_config(cfg, engine) -> EvalSpec:
    """How the main job evaluates (cfg: a config.RunConfig): --eval_* and the rollout's sampling; the
    held-out set as `heldout_prompt_len` says, the extra sets' batches bucketed by prompt length
    (`batch_tokens`)."""
    ro = cfg.rollout
    return EvalSpec(
        n_samples=cfg.eval.samples,
        ks=cfg.eval.ks,
        batch=cfg.eval.batch,
        max_new_tokens=ro.max_new_tokens,
        temperature=ro.temperature,
        top_k=ro.top_k,
        top_p=ro.top_p,
        prompt_len=heldout_prompt_len(engine, cfg.tasks.prompt_len),
        max_batch_tokens=batch_tokens(engine, cfg.eval.batch, cfg.tasks.prompt_len),
        max_turns=cfg.eval.max_turns or ro.max_turns,
        feedback_tokens=ro.feedback_tokens,
        turn_discount=ro.turn_discount,
        deadline_s=cfg.sandbox.deadline_s,
        stop_on_failure=cfg.sandbox.stop_on_failure,
    )


def heldout_prompt_len(engine, prompt_len: int) -> int | None:
    """The held-out set's prompt width: the static engine's at the run's --prompt_len (one compiled sampler
    for every batch, as in training); the continuous engine's bucketed by prompt length (None), because its
    decode step reads every prompt column of its slots: MBPP's test prompts (median 142 tokens through
    SmolLM2's chat template) padded to a --prompt_len of 768 made every step read 1 280 columns where about
    700 hold the batch."""
    return None if engine.kind == "continuous" else prompt_len


def batch_tokens(engine, batch: int, prompt_len: int) -> int | None:
    """The prompt-position budget of a batch of prompts bucketed by length: the static engine's batches of
    long prompts hold no more prompt positions than `batch` prompts of the run's `prompt_len` (its caches
    and prefill grow with rows x length); the continuous engine's memory is bounded by its slots, and its
    queue runs best long, so its batches are `batch` prompts whatever their length (None)."""
    return None if engine.kind == "continuous" else batch * prompt_len


def plan(policy: Policy, problems, spec: EvalSpec):
    """The sampler batches of `problems` (codegen.pipeline.plan_batches)."""
    return pipeline.plan_batches(
        policy.tok, problems, spec.prompt_len, spec.batch, policy.fmt, spec.max_batch_tokens
    )


def evaluate(
    policy: Policy,
    engine,
    executor,
    problems,
    key,
    spec: EvalSpec,
    *,
    progress=None,
    details: dict | None = None,
    batches=None,
    store: SampleStore | None = None,
) -> dict[str, float]:
    """The metrics of codegen.pipeline.evaluate for `policy` sampled through `engine` with `key` (see the
    module docstring). `progress`: an eval.progress.EvalProgress whose sampler wrapper prints a line per
    batch; `batches`: the plan when the caller made it already (`plan`); `details`: receives the texts,
    verdicts and, with turns, the per-turn records; `store`: the sampler calls (and their later turns) of an
    earlier attempt at this evaluation (SampleStore)."""
    batches = plan(policy, problems, spec) if batches is None else batches
    fn = sample_fn(policy, engine, key, spec, store=store)
    if progress is not None:
        fn = progress.sampler(fn)
    return pipeline.evaluate(
        fn,
        executor,
        policy.tok,
        problems,
        n_samples=spec.n_samples,
        ks=spec.ks,
        prompt_len=spec.prompt_len,
        batch=spec.batch,
        deadline_s=spec.deadline_s,
        fmt=policy.fmt,
        details=details,
        turns=eval_turns(policy, engine, executor, key, spec, store=store),
        plan=batches,
        stop_on_failure=spec.stop_on_failure,
    )


def release_all() -> None:
    """Before an evaluation, with the persistent compilation cache on: drop every sampler's executable, the
    training rollout's included (loaded back from the cache at the next rollout, in seconds), so that the
    evaluation's own do not sit on top of them (sampling.release_compiled). Not while an asynchronous
    rollout may be sampling (the caller's to know)."""
    if compile_cache.directory() is None:
        return
    sampling.release_compiled()
    release_host_memory()


def release_engine(engine) -> None:
    """After an evaluation: drop its engine's executables (one per prompt-length bucket, ~85 MB of host memory
    each for SmolLM2) when the persistent compilation cache is on, so the next evaluation loads them back in
    seconds; without the cache they are kept (compiling one takes ~30 s). Freed memory goes back to the OS."""
    if compile_cache.directory() is None:
        return
    engine.release()
    release_host_memory()
