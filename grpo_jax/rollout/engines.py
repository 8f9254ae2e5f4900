"""Rollout engines: ONE protocol through which every caller samples the policy.

    engine = make_engine("static" | "continuous", model_cfg, max_new=T, eos_ids=(...), pad_id=0,
                         weights_dtype="float32", slots=32, chunk=16)
    out = engine.generate(params, prompt [B, P], prompt_mask, key, n=G, sp=sp)       # SampleOutput [B, G, T]
    out, conv = engine.generate_kept(params, prompt, prompt_mask, key, n=G, sp=sp)  # + the conversations
    conv = engine.select(conv, rows)                                # the conversations `rows` go on with
    out, conv = engine.extend(params, conv, tokens [R, F], mask, key, sp=sp)        # feedback + next reply
    out, conv = engine.from_tokens(params, context [R, S], mask, key, sp=sp)        # conversations as tokens
    engine.release()                                                # drop the compiled executables

Callers: the training rollout (grpo_jax.rollout.codegen: generate, generate_kept), multi-turn trajectories in
training and evaluation (grpo_jax.rollout.multiturn: select, extend, from_tokens), the main job's held-out
evaluation and `experiments.evaluate` (grpo_jax.eval: generate). `--rollout_engine` picks the engine for all
of them, so evaluation is graded on the decoder that training samples with. `sp` (sampling.SamplingParams:
temperature, top-k, top-p, greedy) is data; `out.logp` holds the behaviour log-probs of the distribution each
token was drawn from (top-k / top-p truncation included), `out.mask` 1 on the sampled tokens up to and
including the end-of-generation id, `out.truncated` the samples that reached T tokens without one. Outputs
are device arrays. A conversation handle (`conv`) is the engine's own; callers only pass it back.

* `StaticEngine`: the batch sampler of grpo_jax.policies.sampling, one compiled `lax.while_loop` over all
  B x G rows that runs until the last row ends; the G samples of a prompt share one prefill. Its multi-turn
  conversations continue from the first turn's KV cache (grpo_jax.policies.continuation: only the feedback
  turn is encoded). Every figure of the project before issue 42 was measured on it.
* `ContinuousEngine`: continuous batching (grpo_jax.policies.continuous): R decode slots with their own
  positions and KV caches; the prompts are encoded once (in blocks of at most PREFILL_SCORES_BYTES of
  attention scores, as the queue reaches them) and a prompt's samples copied into free slots as slots
  finish; once nothing is pending the running slots move into batches half as large. A sample's tokens
  depend only on its key (fold_in(call key, b * n + j)), not on the slot count (tests). Its conversations
  are kept as tokens and a later turn encodes them again (one prefill per turn).
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.policies import continuation, sampling
from grpo_jax.policies import continuous as cb
from grpo_jax.policies import transformer as tfm
from grpo_jax.runtime.sharding import to_host
from grpo_jax.types import SampleOutput

ENGINES = ("static", "continuous")


class RolloutEngine(Protocol):
    """What every caller of the policy's sampler uses (see the module docstring)."""

    kind: str
    max_new: int  # T: the most new tokens of a reply
    eos_ids: tuple[int, ...]  # the ids that end a reply
    last_stats: dict  # the last call's counts (samples, useful_tokens, decode_steps, row_steps, seconds, ...)

    def generate(self, params, prompt, prompt_mask, key, *, n: int, sp) -> SampleOutput: ...
    def generate_kept(self, params, prompt, prompt_mask, key, *, n: int, sp) -> tuple[SampleOutput, Any]: ...
    def select(self, conv, rows) -> Any: ...
    def extend(self, params, conv, tokens, mask, key, *, sp) -> tuple[SampleOutput, Any]: ...
    def from_tokens(self, params, context, context_mask, key, *, sp) -> tuple[SampleOutput, Any]: ...
    def release(self) -> None: ...
    def cache_size(self) -> int: ...


def rows_stats(out: SampleOutput, seconds: float) -> dict[str, float]:
    """A static batch's counts: every row runs until the longest ends (decode steps = the longest sample).
    The lengths are read with to_host: under --dist they span every process's devices (a collective that every
    process makes alike, as each samples the same global batch)."""
    lengths = to_host(out.lengths)
    steps = int(lengths.max(initial=0))
    return {
        "samples": float(lengths.size),
        "useful_tokens": float(lengths.sum()),
        "decode_steps": float(steps),
        "row_steps": float(lengths.size * steps),
        "seconds": seconds,
    }


class _TurnOne(NamedTuple):
    """The static engine's first-turn conversations: the sampler's KV cache and the sampled tokens' mask."""

    cache: tfm.KVCache
    mask: jax.Array


class StaticEngine:
    """The batch sampler (see the module docstring); `weights_dtype`: the sampler's weights (--rollout_dtype).
    Compiled once per (group size, prompt shape)."""

    kind = "static"

    def __init__(
        self, model: tfm.TransformerConfig, *, max_new: int, eos_ids, pad_id: int, weights_dtype="float32"
    ):
        self.model, self.max_new, self.weights_dtype = model, max_new, weights_dtype
        self.eos_ids = tuple(int(i) for i in np.atleast_1d(eos_ids))
        self.kw = dict(max_new=max_new, eos_id=self.eos_ids, pad_id=pad_id)
        self._continue = continuation.make_continuer(model, weights_dtype=weights_dtype, **self.kw)
        self._fns: dict[tuple[int, bool], Any] = {}
        self.last_stats: dict[str, float] = {}

    def _sampler(self, n: int, with_cache: bool):
        if (n, with_cache) not in self._fns:
            self._fns[n, with_cache] = sampling.make_sampler(
                self.model, group=n, with_cache=with_cache, weights_dtype=self.weights_dtype, **self.kw
            )
        return self._fns[n, with_cache]

    def generate(self, params, prompt, prompt_mask, key, *, n: int, sp) -> SampleOutput:
        t = time.perf_counter()
        out = self._sampler(n, False)(params, jnp.asarray(prompt), jnp.asarray(prompt_mask), key, sp)
        self.last_stats = rows_stats(out, time.perf_counter() - t)
        return out

    def generate_kept(self, params, prompt, prompt_mask, key, *, n: int, sp):
        t = time.perf_counter()
        out, cache = self._sampler(n, True)(params, jnp.asarray(prompt), jnp.asarray(prompt_mask), key, sp)
        self.last_stats = rows_stats(out, time.perf_counter() - t)
        return out, _TurnOne(cache, out.mask)

    def select(self, conv, rows):
        """The conversations `rows`: indices into the first turn's B * G samples (problem-major), or into the
        rows of the conversations a later turn returned."""
        rows = jnp.asarray(rows)
        if isinstance(conv, _TurnOne):
            return continuation.rows_from_cache(conv.cache, jnp.asarray(conv.mask), rows)
        return continuation.take(conv, rows)

    def extend(self, params, conv, tokens, mask, key, *, sp):
        return self._continue.extend_decode(params, conv, jnp.asarray(tokens), jnp.asarray(mask), key, sp)

    def from_tokens(self, params, context, context_mask, key, *, sp):
        return self._continue.from_tokens(params, jnp.asarray(context), jnp.asarray(context_mask), key, sp)

    def release(self) -> None:
        for fn in (*self._fns.values(), *self._continue):
            fn.clear_cache()

    def cache_size(self) -> int:
        """Compiled executables its samplers hold (first turns; release() drops them)."""
        return sum(_compiled(fn) for fn in self._fns.values())


def _compiled(fn) -> int:
    """The compiled executables of a jitted function (or of a sampling.with_rollout_weights wrapper's)."""
    size = getattr(fn, "_cache_size", None) or getattr(getattr(fn, "jitted", None), "_cache_size", None)
    return int(size()) if size is not None else 0


def pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


class Contexts(NamedTuple):
    """The continuous engine's conversations: each row's real tokens so far (prompt, replies, feedback) and
    the width they are left-padded to when a later turn encodes them (grows by F + T per turn, as the static
    engine's cache does: few compiled shapes)."""

    rows: list
    width: int


class ContinuousEngine:
    """Continuous batching (see the module docstring). `slots`: the most decode slots R; `chunk`: decode
    steps per device call, between which the host moves the drawn tokens out, inserts pending samples into
    the slots that finished and shrinks the batch; `min_slots`: the smallest batch the running slots move
    into. One call runs the B * n samples of its prompts as one queue."""

    kind = "continuous"

    def __init__(
        self,
        model: tfm.TransformerConfig,
        *,
        max_new: int,
        eos_ids,
        pad_id: int,
        weights_dtype: str = "float32",
        slots: int = 32,
        chunk: int = 16,
        min_slots: int = 4,
    ):
        if slots < 1 or chunk < 1 or min_slots < 1:
            raise ValueError(
                f"ContinuousEngine: slots={slots}, chunk={chunk}, min_slots={min_slots}: each >= 1"
            )
        self.model, self.max_new, self.weights_dtype = model, max_new, weights_dtype
        self.eos_ids = tuple(int(i) for i in np.atleast_1d(eos_ids))
        self.pad_id, self.slots, self.chunk, self.min_slots = pad_id, slots, chunk, min_slots
        self.run_cfg = sampling.rollout_config(model, weights_dtype)
        cast = lambda p: sampling.rollout_weights(p, model, weights_dtype)[0]  # noqa: E731
        self._cast = None if self.run_cfg is model else sampling.track(jax.jit(cast))
        self._prefill = sampling.track(jax.jit(functools.partial(cb.prompt_cache, cfg=self.run_cfg)))
        self._insert = sampling.track(jax.jit(cb.insert))
        self._take = sampling.track(jax.jit(cb.take))
        self._keys = sampling.track(jax.jit(cb.sample_keys, static_argnums=1))
        self._init = sampling.track(jax.jit(cb.init_slots, static_argnums=(0, 1, 2, 3)))
        self._chunks: dict[int, Any] = {}
        self.last_stats: dict[str, float] = {}

    def _chunk_fn(self, prompt_len: int):
        if prompt_len not in self._chunks:
            kw = dict(
                steps=self.chunk,
                prompt_len=prompt_len,
                max_new=self.max_new,
                eos_id=self.eos_ids,
                pad_id=self.pad_id,
            )

            def fn(params, slots, sp):
                return cb.decode_chunk(params, self.run_cfg, slots, sp, **kw)

            self._chunks[prompt_len] = sampling.track(jax.jit(fn, donate_argnums=1))
        return self._chunks[prompt_len]

    def release(self) -> None:
        fns = (self._prefill, self._insert, self._take, self._keys, self._init, *self._chunks.values())
        for fn in fns + ((self._cast,) if self._cast is not None else ()):
            fn.clear_cache()

    def cache_size(self) -> int:
        """Compiled executables of its decode chunks (release() drops them)."""
        return sum(_compiled(fn) for fn in self._chunks.values())

    def generate(self, params, prompt, prompt_mask, key, *, n: int, sp) -> SampleOutput:
        out = self._run(params, np.asarray(prompt), np.asarray(prompt_mask), key, n, sp)
        return jax.tree.map(jnp.asarray, out)

    def generate_kept(self, params, prompt, prompt_mask, key, *, n: int, sp):
        prompt, prompt_mask = np.asarray(prompt), np.asarray(prompt_mask)
        out = self._run(params, prompt, prompt_mask, key, n, sp)
        t = out.tokens.shape[-1]
        rows = [
            np.r_[prompt[b][prompt_mask[b] > 0], out.tokens[b, j, : int(out.lengths[b, j])]]
            for b in range(prompt.shape[0])
            for j in range(n)
        ]
        return jax.tree.map(jnp.asarray, out), Contexts(rows, prompt.shape[1] + t)

    def select(self, conv: Contexts, rows) -> Contexts:
        return Contexts([conv.rows[int(r)] for r in np.asarray(rows)], conv.width)

    def extend(self, params, conv: Contexts, tokens, mask, key, *, sp):
        tokens, mask = np.asarray(tokens), np.asarray(mask)
        ctx = [np.r_[row, tokens[i][mask[i] > 0]] for i, row in enumerate(conv.rows)]
        return self._continue(params, ctx, conv.width + tokens.shape[1], key, sp)

    def from_tokens(self, params, context, context_mask, key, *, sp):
        context, context_mask = np.asarray(context), np.asarray(context_mask)
        ctx = [context[i][context_mask[i] > 0] for i in range(context.shape[0])]
        return self._continue(params, ctx, context.shape[1], key, sp)

    def _continue(self, params, ctx: list, width: int, key, sp):
        """The next reply after each row's tokens `ctx` (left-padded to `width`): [R, 1, T] and the rows with
        the reply appended."""
        prompt = np.full((len(ctx), width), self.pad_id, np.int32)
        pmask = np.zeros((len(ctx), width), np.int32)
        for i, row in enumerate(ctx):
            prompt[i, width - row.size :], pmask[i, width - row.size :] = row, 1
        out = self._run(params, prompt, pmask, key, 1, sp)
        rows = [np.r_[row, out.tokens[i, 0, : int(out.lengths[i, 0])]] for i, row in enumerate(ctx)]
        return jax.tree.map(jnp.asarray, out), Contexts(rows, width + self.max_new)

    def _run(self, params, prompt: np.ndarray, prompt_mask: np.ndarray, key, n: int, sp) -> SampleOutput:
        """n samples of each prompt through the slots: SampleOutput [B, n, T] of host arrays; `last_stats`."""
        t_start = time.perf_counter()
        w = params if self._cast is None else self._cast(params)
        b, p = prompt.shape
        prompts = _Prompts(self, w, prompt, prompt_mask)
        prompts.cache(0)  # the first block now (prefill_s)
        q = _Queue(b * n, n, self.max_new, self.pad_id, self._keys(key, b * n), self.eos_ids)
        rows = min(self.slots, pow2(q.total))
        q.slot_of = np.full(rows, -1, np.int64)
        slots = self._init(self.run_cfg, rows, p, self.max_new)
        chunk = self._chunk_fn(p)
        st: dict[str, float] = dict(chunks=0, decode_steps=0, row_steps=0, inserts=0, shrinks=0, tail_steps=0)
        st["last10_s"] = 0.0
        t_prefill = time.perf_counter()
        while q.done < q.total:
            if q.pending and q.free.size:
                slots = self._fill(slots, prompts, q, rows)
                st["inserts"] += 1
            elif not q.pending:
                new = max(self.min_slots, pow2(q.running.size))
                if new <= rows // 2:  # nothing pending: the running slots into a batch half as large or less
                    keep = np.r_[q.running, q.free[: new - q.running.size]]
                    slots = self._take(slots, jnp.asarray(keep, jnp.int32))
                    q.slot_of, rows = q.slot_of[keep], new
                    st["shrinks"] += 1
            tail, late, t_chunk = not q.pending, q.done >= 0.9 * q.total, time.perf_counter()
            slots, out = chunk(w, slots, sp)
            drawn = jax.device_get((out.tokens, out.logp, out.mask, slots.active))
            steps = q.collect(*(np.asarray(x) for x in drawn))
            st["chunks"] += 1
            st["decode_steps"] += steps
            st["row_steps"] += rows * steps
            st["tail_steps"] += steps if tail else 0
            if late:  # the wait for the slowest tenth: chunks run once 90 % of the samples had ended
                st["last10_s"] += time.perf_counter() - t_chunk
        st.update(samples=q.total, useful_tokens=int(q.count.sum()), prefill_s=t_prefill - t_start)
        st["seconds"] = time.perf_counter() - t_start
        self.last_stats = {k: float(v) for k, v in st.items()}
        return q.output(b, n)

    def _fill(self, slots, prompts: _Prompts, q: _Queue, rows: int):
        """Insert the next pending samples into the free slots: one call per block of prompts they come
        from (usually one), each index list padded to a power of two with `rows`, which the insert drops."""
        m = min(q.free.size, q.pending)
        sids = np.arange(q.next, q.next + m)
        where = q.free[:m]
        q.start(where, sids)
        blocks = sids // q.n // prompts.rows
        for blk in np.unique(blocks):
            sel = np.flatnonzero(blocks == blk)
            lo, k = int(sids[sel[0]]), sel.size
            size = min(rows, pow2(k))
            idx = np.full(size, rows, np.int32)
            idx[:k] = where[sel]
            pid = np.zeros(size, np.int32)
            pid[:k] = sids[sel] // q.n - blk * prompts.rows
            keys = jnp.zeros((size, 2), jnp.uint32).at[:k].set(q.keys[lo : lo + k])
            slots = self._insert(slots, prompts.cache(int(blk)), jnp.asarray(idx), jnp.asarray(pid), keys)
        prompts.drop_before(min(q.next, q.total - 1) // q.n // prompts.rows)
        return slots


class _Prompts:
    """A call's prompts, encoded in blocks of `rows` prompts as the queue reaches them; a block is dropped
    once every sample of its prompts has started. The prefill's attention scores grow with rows x P^2: a
    call of many wide prompts (a multi-turn evaluation continues hundreds of conversations of P + T + F
    tokens at once) would need tens of GB encoded at once, a block at most `PREFILL_SCORES_BYTES` of scores.
    A call whose prompts fit one block encodes them as one batch, as before blocks existed."""

    def __init__(self, engine: ContinuousEngine, w, prompt: np.ndarray, mask: np.ndarray):
        self.engine, self.w, self.prompt, self.mask = engine, w, prompt, mask
        self.rows = prefill_rows(engine.run_cfg, *prompt.shape)
        self.blocks: dict[int, Any] = {}

    def cache(self, blk: int):
        if blk not in self.blocks:
            b, lo = self.prompt.shape[0], blk * self.rows
            # one block: the prompts as given; else the last block padded with its last prompt (one compiled
            # shape; the copies are never inserted)
            rows = np.arange(b) if self.rows >= b else np.minimum(np.arange(lo, lo + self.rows), b - 1)
            p, m = jnp.asarray(self.prompt[rows]), jnp.asarray(self.mask[rows])
            self.blocks[blk] = self.engine._prefill(self.w, prompt=p, prompt_mask=m)
        return self.blocks[blk]

    def drop_before(self, blk: int) -> None:
        for b in [b for b in self.blocks if b < blk]:
            del self.blocks[b]


# the most bytes of float32 attention scores one prefill call of the continuous engine computes (one layer's
# [rows, heads, P, P]): 1 GiB, e.g. 50 prompts of 768 tokens or 12 of 1 536 for SmolLM2's 9 heads
PREFILL_SCORES_BYTES = 1 << 30


def prefill_rows(cfg: tfm.TransformerConfig, b: int, p: int) -> int:
    """The prompts per prefill call of a continuous call of b prompts of p tokens (_Prompts)."""
    return int(max(1, min(b, PREFILL_SCORES_BYTES // (4 * cfg.n_heads * p * p))))


class _Queue:
    """The host's view of one continuous call: which sample each slot holds, the tokens drawn so far."""

    def __init__(self, total: int, n: int, t_max: int, pad_id: int, keys, eos_ids: tuple[int, ...]):
        self.total, self.n, self.keys, self.eos_ids, self.next, self.done = total, n, keys, eos_ids, 0, 0
        self.slot_of = np.zeros(0, np.int64)
        self.tokens = np.full((total, t_max), pad_id, np.int32)
        self.logp = np.zeros((total, t_max), np.float32)
        self.count = np.zeros(total, np.int64)

    @property
    def pending(self) -> int:
        return self.total - self.next

    @property
    def free(self) -> np.ndarray:
        return np.flatnonzero(self.slot_of < 0)

    @property
    def running(self) -> np.ndarray:
        return np.flatnonzero(self.slot_of >= 0)

    def start(self, where, sids) -> None:
        self.slot_of[where] = sids
        self.next += len(sids)

    def collect(self, tokens, logp, mask, active) -> int:
        """Move a chunk's draws into the samples' rows; free the slots whose sample ended. Returns the decode
        steps the chunk ran."""
        for r in self.running:
            s, k = self.slot_of[r], int(mask[r].sum())
            self.tokens[s, self.count[s] : self.count[s] + k] = tokens[r, :k]
            self.logp[s, self.count[s] : self.count[s] + k] = logp[r, :k]
            self.count[s] += k
            if not active[r]:
                self.slot_of[r] = -1
                self.done += 1
        return int(mask.any(axis=0).sum())

    def output(self, b: int, n: int) -> SampleOutput:
        t_max = self.tokens.shape[1]
        mask = (np.arange(t_max)[None, :] < self.count[:, None]).astype(np.float32)
        last = self.tokens[np.arange(self.total), np.maximum(self.count - 1, 0)]
        ended = np.isin(last, self.eos_ids) & (self.count > 0)
        shape = (b, n, t_max)
        return SampleOutput(
            self.tokens.reshape(shape),
            self.logp.reshape(shape),
            mask.reshape(shape),
            self.count.astype(np.int32).reshape(b, n),
            ~ended.reshape(b, n),
        )


def make_engine(
    kind: str,
    model: tfm.TransformerConfig,
    *,
    max_new: int,
    eos_ids,
    pad_id: int,
    weights_dtype: str = "float32",
    slots: int = 32,
    chunk: int = 16,
) -> RolloutEngine:
    """The engine `kind` (ENGINES) of a model: `weights_dtype` its sampler's weights; `slots`, `chunk` the
    continuous engine's (the static engine has none)."""
    if kind == "static":
        return StaticEngine(
            model, max_new=max_new, eos_ids=eos_ids, pad_id=pad_id, weights_dtype=weights_dtype
        )
    if kind == "continuous":
        return ContinuousEngine(
            model,
            max_new=max_new,
            eos_ids=eos_ids,
            pad_id=pad_id,
            weights_dtype=weights_dtype,
            slots=slots,
            chunk=chunk,
        )
    raise ValueError(f"rollout engine {kind!r}: valid: {', '.join(ENGINES)}")
