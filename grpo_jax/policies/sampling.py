"""KV-cache sampler: G completions per prompt, compiled once per shape.

The prompt of a group is encoded once (`transformer.prefill`) and its cache is shared by the group's G
samples; each decode step feeds one token per sample (`transformer.decode_step`). The loop is a
`lax.while_loop` that stops as soon as every sample has emitted EOS (or after `max_new` tokens).

Sampling parameters (temperature, top-k, top-p) are DATA (a `SamplingParams` of arrays), so changing them
never recompiles; only the shapes (B, P, G, max_new) and the model config are static.

Returned `logp` is the BEHAVIOUR log-probability of each sampled token: its log-probability under the
distribution it was actually drawn from, log_softmax(filtered(logits / temperature)) (`choose_tokens`). With
top-k / top-p off (top_k = 0, top_p = 1) nothing is filtered and that is log_softmax(logits / temperature),
computed exactly as the trainer's `token_logp` with the same temperature, so sampler and trainer log-probs
agree up to float rounding (the mismatch is logged as `logp_mismatch`). With top-k / top-p on it is the log of
the RENORMALISED truncated probability, p(tok) / Σ_kept p, which is >= the trainer's untruncated π_θ(tok) by
−log(kept mass): the importance-sampling correction (`--tis_cap`, weight π_old / π_behaviour) and the
off-policy mask see the truncation, and `logp_mismatch` includes it. The nucleus (top-p) is taken under the
temperature-scaled softmax (the filter runs on logits / temperature). Greedy (temperature <= 0): the token is
the argmax and `logp` stays what it always was, log_softmax(logits) at temperature 1 WITHOUT truncation (a
greedy draw is deterministic and has no sampling distribution to correct for; greedy decoding is used for
evaluation, where logp is not consumed).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.policies import lora
from grpo_jax.policies import transformer as tfm
from grpo_jax.types import SampleOutput


class SamplingParams(NamedTuple):
    temperature: jax.Array  # [] float32; <= 0 means greedy (argmax), logp then untruncated at temperature 1
    top_k: jax.Array  # [] int32; 0 disables
    top_p: jax.Array  # [] float32; >= 1 disables


def sampling_params(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> SamplingParams:
    if temperature < 0:
        raise ValueError(f"temperature={temperature}: must be >= 0 (0 = greedy)")
    if top_k < 0:
        raise ValueError(f"top_k={top_k}: must be >= 0 (0 = off)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p}: must be in (0, 1] (1 = off)")
    return SamplingParams(
        jnp.asarray(temperature, jnp.float32), jnp.asarray(top_k, jnp.int32), jnp.asarray(top_p, jnp.float32)
    )


FILTER_TOPK = 64  # static top_k width of filter_logits' fast path (a cost knob, not a limit on top_k)


def _order_keys(x: jax.Array) -> jax.Array:
    """uint32 keys with the order of the float32 values (IEEE bits, negatives flipped; -0.0 as +0.0)."""
    x = jnp.where(x == 0, jnp.float32(0.0), x.astype(jnp.float32))
    b = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(b >> 31 == 1, ~b, b | jnp.uint32(0x80000000))


def _bisect(ok, lo: jax.Array, hi: jax.Array, active: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Integer bisection on uint32 keys, per row: with ok(u) monotone (True up to some u*, False after) and
    ok(lo) True, ok(hi) False, narrow until hi = lo + 1, so lo = max{u : ok(u)} and hi = min{u : not ok(u)}.
    Rows with active False are left as they are; the loop stops when every active row has converged (at most
    32 iterations, each one pass over V; none at all when no row is active)."""

    def cond(c):
        lo, hi = c
        return jnp.any(active & (hi - lo > 1))

    def body(c):
        lo, hi = c
        mid = lo + (hi - lo) // 2
        run = active & (hi - lo > 1)
        good = ok(mid)
        return jnp.where(run & good, mid, lo), jnp.where(run & ~good, mid, hi)

    return jax.lax.while_loop(cond, body, (lo, hi))


def filter_logits(
    logits: jax.Array, top_k: jax.Array, top_p: jax.Array, *, k0: int = FILTER_TOPK
) -> jax.Array:
    """Set logits outside the top-k set and outside the top-p nucleus to -inf.

    Definition (the sorted reference; `tests/test_sampling.py` keeps it as the oracle): with s the logits
    sorted descending and p = softmax(s),
        k-threshold  t_k = s[min(top_k, V) − 1]                               (top_k = 0: off)
        p-threshold  t_p = s[n − 1],  n = max(#{i : Σ_{j<i} p_j < top_p}, 1)   (top_p ≥ 1: off)
    and a logit is kept iff it is >= max(t_k, t_p) (so ties with a threshold are all kept; the nucleus is
    taken under the untruncated softmax, not after top-k).

    No sort of the vocabulary (an XLA:CPU sort of [64, 49152] takes ~0.5 s): one `lax.top_k` of static width
    k0 gives s[:k0]. t_k = s[k − 1] when k <= k0; t_p comes from the cumulative mass of s[:k0] (the
    normaliser Σ exp(x − max) is one pass over V) whenever the nucleus ends inside the first k0 (fewer than
    k0 positions have Σ_{j<i} p_j < top_p). Otherwise the threshold is found EXACTLY by bisection over the
    float order (uint32 keys of the logits, at most 32 passes over V, only for the rows that need it):
        t_k = the largest logit x with #{logits >= x} >= k,
        t_p = the smallest logit x with Σ p [logits > x] < top_p
    (the same values as the sorted definition: every position before the first occurrence of x holds exactly
    the mass of the logits > x). The cumulative masses are float32 sums in a different order than the
    reference's cumsum, so the two agree up to float32 rounding of a mass that lands within ~1e-7 of top_p.
    The nucleus search is skipped when 0 < top_k <= k0 (then t_p <= s[k0 − 1] <= t_k). top_k stays data: any
    value works with the same compiled code (k > k0 takes the bisection)."""
    x = logits.astype(jnp.float32)
    v = x.shape[-1]
    k0 = min(k0, v)
    vals = jax.lax.top_k(x, k0)[0]  # [..., k0] descending: the first k0 of the sorted logits
    neg = jnp.full((*x.shape[:-1], 1), -jnp.inf, jnp.float32)

    def keyed():  # (keys, min key, max key), only on the exact (bisection) paths
        keys = _order_keys(x)
        return keys, jnp.min(keys, axis=-1, keepdims=True), jnp.max(keys, axis=-1, keepdims=True)

    def k_threshold(_):
        k = jnp.minimum(top_k, v).astype(jnp.int32)

        def fast(_):
            return jax.lax.dynamic_slice_in_dim(vals, jnp.minimum(k, k0) - 1, 1, axis=-1)

        def exact(_):  # k > k0: t_k has key max{u : #{keys >= u} >= k}
            keys, kmin, kmax = keyed()

            def ok(u):
                return jnp.sum(keys >= u, axis=-1, keepdims=True) >= k

            lo, _ = _bisect(ok, kmin, kmax + 1, jnp.ones_like(kmin, bool))
            return jnp.max(jnp.where(keys <= lo, x, -jnp.inf), axis=-1, keepdims=True)

        return jax.lax.cond(k <= k0, fast, exact, None)

    def p_threshold(_):
        m = vals[..., :1]
        z = jnp.sum(jnp.exp(x - m), axis=-1, keepdims=True)
        probs = jnp.exp(vals - m) / z
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly before each sorted position
        count = jnp.sum(before < top_p, axis=-1, keepdims=True)
        fast = jnp.take_along_axis(vals, jnp.maximum(count, 1) - 1, axis=-1)
        inside = (count < k0) | (k0 == v)  # the nucleus ends within s[:k0]
        # beyond s[:k0], t_p <= s[k0 - 1] <= t_k when 0 < top_k <= k0: the k-threshold decides, no search
        covered = (top_k > 0) & (top_k <= k0)
        fast = jnp.where(inside | ~covered, fast, -jnp.inf)
        inside = inside | covered

        def exact(_):  # t_p has key min{u : Σ p [keys > u] < top_p}, searched below the key of s[k0 - 1]
            keys, kmin, _ = keyed()
            p = jnp.exp(x - m) / z

            def ok(u):
                return jnp.sum(jnp.where(keys > u, p, 0.0), axis=-1, keepdims=True) >= top_p

            _, hi = _bisect(ok, kmin - 1, _order_keys(vals[..., -1:]), ~inside)
            tp = jnp.min(jnp.where(keys >= hi, x, jnp.inf), axis=-1, keepdims=True)
            return jnp.where(inside, fast, tp)

        return jax.lax.cond(jnp.all(inside), lambda _: fast, exact, None)

    kth = jax.lax.cond(top_k > 0, k_threshold, lambda _: neg, None)
    pth = jax.lax.cond(top_p < 1.0, p_threshold, lambda _: neg, None)
    thr = jnp.maximum(kth, pth)
    return jnp.where(x >= thr, logits, -jnp.inf)


CDF_BLOCK = 256  # ids per block of sample_categorical's two-level inverse CDF


def _inverse_cdf(blocks: jax.Array, u1: jax.Array, u2: jax.Array) -> jax.Array:
    """The id drawn by uniforms u1, u2 in (0, 1] [...] from unnormalised probabilities blocks [..., nb, w]:
    the block b with C[b-1] < u1 * C[-1] <= C[b] (C the running sum of the block sums), then the id j
    inside it with c[j-1] < u2 * c[-1] <= c[j] (c the running sum of that block); returns b * w + j. A
    zero-probability block or id is never chosen (its running sum equals its predecessor's, so it cannot
    satisfy both sides)."""
    nb, w = blocks.shape[-2], blocks.shape[-1]
    c = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [..., nb]
    b = jnp.minimum(jnp.sum(c < u1[..., None] * c[..., -1:], axis=-1), nb - 1)
    inner = jnp.take_along_axis(blocks, b[..., None, None], axis=-2)[..., 0, :]  # [..., w]
    c2 = jnp.cumsum(inner, axis=-1)
    j = jnp.minimum(jnp.sum(c2 < u2[..., None] * c2[..., -1:], axis=-1), w - 1)
    return (b * w + j).astype(jnp.int32)


def sample_categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One id per row drawn from softmax(logits) over the last axis (int32 [...]): an exact draw by a
    two-level inverse CDF (ids in blocks of CDF_BLOCK: choose a block by its mass, then an id inside it) from
    TWO uniforms per row, where `jax.random.categorical` (Gumbel-max) draws one per id: on a 49 152-id
    vocabulary the Gumbel draw was ~96 % of the token choice's time on CPU (WORKSPACE.md §6, "Decoding").
    -inf logits (filtered ids) have probability exactly 0 and are never drawn. Float32
    limits: an id whose probability is below ~1e-7 of the row's total is drawn with a rounded probability
    (as jax.random.categorical's default "low" mode)."""
    u = 1.0 - jax.random.uniform(key, (2, *logits.shape[:-1]), jnp.float32)  # (0, 1]
    return categorical_from_uniforms(u, logits)


def categorical_from_uniforms(u: jax.Array, logits: jax.Array) -> jax.Array:
    """`sample_categorical` with its two uniforms given: u [2, ...] in (0, 1], one pair per row of logits
    [..., V] (the continuous engine draws each row's pair from that row's own key)."""
    lead, v = logits.shape[:-1], logits.shape[-1]
    nb = -(-v // CDF_BLOCK)
    x = logits.astype(jnp.float32)
    p = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    if nb * CDF_BLOCK != v:
        p = jnp.pad(p, [(0, 0)] * len(lead) + [(0, nb * CDF_BLOCK - v)])
    return _inverse_cdf(p.reshape(*lead, nb, CDF_BLOCK), u[0], u[1])


def choose_tokens(logits: jax.Array, key: jax.Array, sp: SamplingParams, uniforms: jax.Array | None = None):
    """Sample (or argmax) one token per row; return (tokens int32, behaviour logp float32).

    Sampling (temperature > 0): the token is drawn (`sample_categorical`) from softmax(f), f =
    filter_logits(logits / temperature, top_k, top_p), and logp = log_softmax(f)[token], the log of its
    renormalised truncated probability (the distribution actually sampled). With the filters off (top_k = 0
    and top_p >= 1) f = logits / temperature and logp = log_softmax(logits / temperature)[token], bit for bit
    the same ops as before truncation was accounted for (the truncated log-softmax runs only in a `lax.cond`
    branch taken when a filter is on). Greedy (temperature <= 0): token = argmax(logits), logp =
    log_softmax(logits)[token] (temperature 1, untruncated, whatever top_k / top_p say; the argmax is always
    inside the kept set). `uniforms` [2, ...]: the draw's uniforms in (0, 1] given instead of `key`
    (categorical_from_uniforms; the continuous engine's per-row keys)."""
    greedy = sp.temperature <= 0
    lg = logits.astype(jnp.float32) / jnp.where(greedy, 1.0, sp.temperature)
    lsm = jax.nn.log_softmax(lg, axis=-1)
    need_filter = (sp.top_k > 0) | (sp.top_p < 1.0)
    filt = jax.lax.cond(need_filter, lambda x: filter_logits(x, sp.top_k, sp.top_p), lambda x: x, lg)
    # only the branch taken runs (a select of both under vmap with per-member temperatures)
    tok = jax.lax.cond(
        greedy,
        lambda: jnp.argmax(lg, axis=-1).astype(jnp.int32),
        lambda: (
            sample_categorical(key, filt) if uniforms is None else categorical_from_uniforms(uniforms, filt)
        ),
    )
    lp = jnp.take_along_axis(lsm, tok[..., None], axis=-1)[..., 0]  # untruncated (filters off, or greedy)

    def truncated(lp):  # the renormalised truncated distribution the token was drawn from
        lp_f = jnp.take_along_axis(jax.nn.log_softmax(filt, axis=-1), tok[..., None], axis=-1)[..., 0]
        return jnp.where(greedy, lp, lp_f)

    # filters off: the identity branch, so lp is exactly the untruncated value above
    lp = jax.lax.cond(need_filter, truncated, lambda lp: lp, lp)
    return tok, lp


SPLIT_DECODE_MIN = 32  # shorter completions decode in one loop (half a short cache is not worth a compile)


def _decode_loop(
    cache,
    logits,
    choose_fn,
    decode_fn,
    *,
    max_new: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
    with_cache: bool = False,
    grow=None,
):
    """The token loop shared by `sample` and `sample_members`: a `lax.while_loop` that stops once every
    sample has emitted EOS — any id of `eos_id` when it is a tuple (an instruct model's end-of-turn and
    end-of-text) — or after max_new tokens. logits [..., V] are the next-token logits of every
    sample (leading shape `lead`); choose_fn(logits, t) -> (tokens, logp) [lead]; decode_fn(cache, tokens, t)
    -> (cache, logits). Returns the SampleOutput, or (SampleOutput, the final cache) `with_cache`.

    grow = (t1, fn): `cache` holds t1 < max_new completion positions; the loop runs to t1 on it, then on
    fn(cache), which holds max_new (two loops: the first tokens' attention reads only t1 cache slots)."""
    lead = logits.shape[:-1]
    at = (0,) * len(lead)
    zeros_i = jnp.full((*lead, max_new), pad_id, jnp.int32)
    zeros_f = jnp.zeros((*lead, max_new), jnp.float32)

    def until(limit: int):  # the loop's condition: tokens left below `limit` and a sample not finished
        return lambda state: (state[0] < limit) & ~jnp.all(state[3])

    def body(state):
        t, cache, logits, finished, toks, lps, msk = state
        tok, lp = choose_fn(logits, t)
        valid = ~finished
        tok = jnp.where(valid, tok, pad_id)
        toks = jax.lax.dynamic_update_slice(toks, tok[..., None], (*at, t))
        lps = jax.lax.dynamic_update_slice(lps, jnp.where(valid, lp, 0.0)[..., None], (*at, t))
        msk = jax.lax.dynamic_update_slice(msk, valid.astype(jnp.float32)[..., None], (*at, t))
        finished = finished | jnp.isin(tok, jnp.asarray(eos_id, jnp.int32).reshape(-1))
        cache, logits = decode_fn(cache, tok, t)
        return t + 1, cache, logits, finished, toks, lps, msk

    state = (jnp.int32(0), cache, logits, jnp.zeros(lead, bool), zeros_i, zeros_f, zeros_f)
    if grow is not None:
        t1, fn = grow
        state = jax.lax.while_loop(until(t1), body, state)
        state = (state[0], fn(state[1]), *state[2:])
    _, cache, _, finished, toks, lps, msk = jax.lax.while_loop(until(max_new), body, state)
    lengths = jnp.sum(msk, axis=-1).astype(jnp.int32)
    out = SampleOutput(toks, lps, msk, lengths, ~finished)
    return (out, cache) if with_cache else out


def sample(
    params,
    cfg: tfm.TransformerConfig,
    prompt: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    sp: SamplingParams,
    *,
    group: int,
    max_new: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
    with_cache: bool = False,
) -> SampleOutput | tuple[SampleOutput, tfm.KVCache]:
    """Draw `group` completions of up to `max_new` tokens for each left-padded prompt [B, P]; `with_cache`:
    (SampleOutput, the final KV cache), for a later turn that continues these conversations
    (grpo_jax.policies.continuation)."""
    b = prompt.shape[0]
    layers = tfm.split_layers(params)  # once, outside the loop
    # bf16 weights (rollout_weights): the prefill unrolled over the same per-layer slices (tfm.prefill)
    unrolled = layers if jnp.dtype(cfg.compute_dtype) != jnp.float32 else None
    # below float32: the first half of the tokens decoded on a half-length completion cache, whose attention
    # reads and key writes touch half the slots (measured in alternating runs: the tiny model's bf16 rollout
    # 0.39-0.43 -> 0.34-0.38 s); float32 keeps one loop and its bits
    t1 = max_new // 2 if tfm.keys_positions_last(cfg) and max_new >= SPLIT_DECODE_MIN else max_new
    cache, logits0 = tfm.prefill(params, cfg, prompt, prompt_mask, group, t1, layers=unrolled)
    logits = jnp.broadcast_to(logits0[:, None, :], (b, group, logits0.shape[-1]))
    grow = (t1, lambda c: tfm.grow_cache(c, cfg, max_new)) if t1 < max_new else None
    res = _decode_loop(
        cache,
        logits,
        lambda lg, t: choose_tokens(lg, jax.random.fold_in(key, t), sp),
        lambda c, tok, t: tfm.decode_step(params, cfg, c, tok, t, layers),
        max_new=max_new,
        eos_id=eos_id,
        pad_id=pad_id,
        with_cache=with_cache,
        grow=grow,
    )
    return (res[0], tfm.canonical_cache(res[1], cfg)) if with_cache else res


def sample_members(
    members,
    cfg: tfm.TransformerConfig,
    prompt: jax.Array,
    prompt_mask: jax.Array,
    keys: jax.Array,
    sp: SamplingParams,
    *,
    group: int,
    max_new: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
) -> SampleOutput:
    """`sample` for M full-parameter policies at once (the policy pool): members is a stacked pytree
    [M, ...] of full parameters, keys [M], sp.temperature [M] (top_k / top_p shared). LoRA members of one
    base: `sample_lora_members` (no per-member copies of the base).

    The prefill, the decode step and the token choice are vmapped over members, but the decode while-loop is
    OUTSIDE the vmap: a while_loop under vmap with a per-member stopping condition would select (copy) the
    whole carry, KV caches included, every step. Same keys => the same tokens as `sample` per member.
    Returns a SampleOutput with a leading member axis [M, B, G, T]."""
    b = prompt.shape[0]
    m = keys.shape[0]

    def pre(member):
        return tfm.prefill(member, cfg, prompt, prompt_mask, group, max_new)

    cache, logits0 = jax.vmap(pre)(members)  # logits0 [M, B, V]
    logits = jnp.broadcast_to(logits0[:, :, None, :], (m, b, group, logits0.shape[-1]))
    # in_axes: SamplingParams' tree with axes (int | None) for leaves, not arrays (hence _make)
    choose = jax.vmap(choose_tokens, in_axes=(0, 0, SamplingParams._make((0, None, None))))
    # the per-layer split once, outside the loop (slicing the stacked layers inside the loop body would copy
    # every member's weights every step)
    layers = jax.vmap(tfm.split_layers)(members)

    def decode(params, layers, cache, tok, t):
        return tfm.decode_step(params, cfg, cache, tok, t, layers)

    return _decode_loop(
        cache,
        logits,
        lambda lg, t: choose(lg, jax.vmap(lambda k: jax.random.fold_in(k, t))(keys), sp),
        lambda c, tok, t: jax.vmap(decode, in_axes=(0, 0, 0, 0, None))(members, layers, c, tok, t),
        max_new=max_new,
        eos_id=eos_id,
        pad_id=pad_id,
    )


def sample_lora_members(
    base,
    adapters,
    alpha: float,
    cfg: tfm.TransformerConfig,
    prompt: jax.Array,
    prompt_mask: jax.Array,
    keys: jax.Array,
    sp: SamplingParams,
    *,
    group: int,
    max_new: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
) -> SampleOutput:
    """`sample_members` for M LoRA members of one frozen base (adapters stacked [M, ...]): no merged copies.

    The M members' prompts are ONE batch of M*B member-major rows (`lora.merge_members`), so every
    projection is one base matmul over all rows plus per-member rank-r deltas (multi-adapter batching,
    Punica / S-LoRA), and prefill, attention and the LM head are the plain batched sampler's. Only the
    token choice is per member (its key, its temperature): same keys => the same tokens as `sample` with
    `lora.merge(base, member_i)`, up to float rounding of the batched matmuls. Returns [M, B, G, T]."""
    b = prompt.shape[0]
    m = keys.shape[0]
    params = lora.merge_members(base, adapters, alpha=alpha)
    cache, logits0 = tfm.prefill(
        params, cfg, jnp.tile(prompt, (m, 1)), jnp.tile(prompt_mask, (m, 1)), group, max_new
    )
    layers = tfm.split_layers(params)  # once, outside the loop
    v = logits0.shape[-1]
    logits = jnp.broadcast_to(logits0[:, None, :], (m * b, group, v))
    # in_axes: SamplingParams' tree with axes (int | None) for leaves, not arrays (hence _make)
    choose = jax.vmap(choose_tokens, in_axes=(0, 0, SamplingParams._make((0, None, None))))

    def choose_fn(lg, t):
        tok, lp = choose(lg.reshape(m, b, group, v), jax.vmap(lambda k: jax.random.fold_in(k, t))(keys), sp)
        return tok.reshape(m * b, group), lp.reshape(m * b, group)

    out = _decode_loop(
        cache,
        logits,
        choose_fn,
        lambda c, tok, t: tfm.decode_step(params, cfg, c, tok, t, layers),
        max_new=max_new,
        eos_id=eos_id,
        pad_id=pad_id,
    )
    return jax.tree.map(lambda x: x.reshape(m, b, *x.shape[1:]), out)


ROLLOUT_DTYPES = ("float32", "bfloat16")


def rollout_config(cfg: tfm.TransformerConfig, dtype: str) -> tfm.TransformerConfig:
    """The model config a sampler with `dtype` weights runs (`rollout_weights`); cfg itself for float32."""
    if dtype not in ROLLOUT_DTYPES:
        raise ValueError(f"rollout dtype {dtype!r}: valid: {', '.join(ROLLOUT_DTYPES)}")
    if dtype == "float32":
        return cfg
    return dataclasses.replace(cfg, compute_dtype=dtype, param_dtype=dtype, tie_embeddings=False)


def rollout_weights(params, cfg: tfm.TransformerConfig, dtype: str = "float32"):
    """(params, cfg) a sampler runs on when its weights are `dtype` (ROLLOUT_DTYPES).

    "float32": the policy's own (params, cfg), untouched (the sampler's numerics are the trainer's). Below
    float32: every floating leaf but the embedding table cast to `dtype` and the config computing in it
    (param_dtype = compute_dtype = dtype; embedded rows are cast after the lookup, because XLA:CPU gathers
    from a bf16 table by converting all of it); the layers come as a list of per-layer casts
    (tfm.split_layers), so the sampler reads them in place instead of slicing a stacked copy; every
    projection kernel [in, out] is stored as rows, `kernel_t` [out, in], and the LM head as `lm_head_t`
    [V, D] (a tied head: the cast table itself, not a per-step conversion of it): XLA:CPU reads the rows
    layout faster in a decode step's few-row products and computes the same sums (`tfm.rows_matmul`; SmolLM2's
    bf16 rollout ~8 % faster, the same tokens and log-probs, WORKSPACE.md §6).
    Logits, log-softmax, the token draw, the completion KV cache and the attention stay float32
    (transformer.KVCache; the prompt cache holds the bf16 k and v as they are). A decode step of a
    weight-read-bound model reads half the bytes; the behaviour policy then differs from π_θ by bf16 rounding
    (`logp_mismatch` measures it, `--tis_cap` corrects for it, as for an inference engine's rollouts). The
    samplers cast in a jitted call of their own (`with_rollout_weights`), before the sampling call: inside
    one jit XLA:CPU kept float32 copies of the cast weights for some of their uses."""
    model = rollout_config(cfg, dtype)
    if model is cfg:
        return params, cfg
    dt = jnp.dtype(dtype)
    # the embedding table stays as it is: a lookup reads a few rows (cast after the gather), and XLA:CPU
    # gathers from a bf16 table by converting all of it to float32 first
    cast = lambda a: a.astype(dt) if jnp.issubdtype(a.dtype, jnp.floating) else a
    out = {k: jax.tree.map(cast, v) for k, v in params.items() if k not in ("embed", "layers")}
    out["embed"] = params["embed"]
    # the layers as a list of per-layer casts (tfm.split_layers), the sampler reads each one in place; every
    # projection as rows [out, in] (kernel_t, tfm.rows_matmul): XLA:CPU reads that layout faster in a decode
    # step's few-row products, with the same sums
    out["layers"] = [_rows_layout(jax.tree.map(cast, lp)) for lp in tfm.split_layers(params)]
    # the LM head as rows [V, D] too: a tied head is the cast embedding table itself (no transposed copy)
    out.pop("lm_head", None)
    out["lm_head_t"] = cast(params["embed"]) if cfg.tie_embeddings else cast(params["lm_head"]).T
    return out, model


def _rows_layout(layer: dict) -> dict:
    """A layer's projections ({"kernel": [in, out], ...}) with each kernel stored as rows, "kernel_t"
    [out, in]."""
    return {
        name: {("kernel_t" if k == "kernel" else k): (a.T if k == "kernel" else a) for k, a in p.items()}
        if isinstance(p, dict) and "kernel" in p
        else p
        for name, p in layer.items()
    }


def policy_weights_dtype(cfg: tfm.TransformerConfig) -> str:
    """The sampler weights dtype that computes as the policy does: its compute dtype when that is one of
    ROLLOUT_DTYPES (a bfloat16 policy casts every weight to bf16 in each matmul anyway, so sampling from the
    bf16 copy is the same policy, read in place and at half the bytes), else float32. Evaluation uses it."""
    return cfg.compute_dtype if cfg.compute_dtype in ROLLOUT_DTYPES else "float32"


_SAMPLERS: weakref.WeakSet = weakref.WeakSet()  # every sampler's jitted function (release_compiled)


def release_compiled() -> None:
    """Drop the compiled executables of every sampler made here (the rollout's and the evaluations'); the
    next call of each compiles it again, or loads it from the persistent compilation cache when that is on.
    SmolLM2's bf16 rollout sampler holds ~0.2 GB of host memory as compiled code."""
    for fn in list(_SAMPLERS):
        fn.clear_cache()


def track(fn):
    """Register a jitted function (anything with `clear_cache()`) with `release_compiled`; returns it."""
    _SAMPLERS.add(fn)
    return fn


def with_rollout_weights(fn, cfg: tfm.TransformerConfig, dtype: str):
    """fn(params, *args), a sampler written for rollout_config(cfg, dtype), jitted and taking the POLICY's
    params: below float32 they are cast by a separate jitted call (once per call), then passed to fn. Its
    `clear_cache()` drops the compiled executables, as a jitted function's does."""
    jitted = jax.jit(fn)
    _SAMPLERS.add(jitted)
    if rollout_config(cfg, dtype) is cfg:
        return jitted
    cast = jax.jit(lambda params: rollout_weights(params, cfg, dtype)[0])

    def call(params, *args):
        return jitted(cast(params), *args)

    def clear_cache():  # as a jitted function's: drop the compiled executables
        jitted.clear_cache()
        cast.clear_cache()

    # mypy does not model attributes set on a function (python/mypy#2087)
    call.clear_cache = clear_cache  # type: ignore[attr-defined]
    call.jitted = jitted  # type: ignore[attr-defined]
    return call


@functools.lru_cache(maxsize=64)
def make_sampler(
    cfg: tfm.TransformerConfig,
    *,
    group: int,
    max_new: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
    with_cache: bool = False,
    weights_dtype: str = "float32",
):
    """A jitted `sampler(params, prompt, prompt_mask, key, sp) -> SampleOutput` (compiled once per shape);
    `with_cache`: -> (SampleOutput, KVCache). `weights_dtype`: the weights and compute dtype the sampler
    runs in (`rollout_weights`; it takes the policy's params and casts them first)."""
    model = rollout_config(cfg, weights_dtype)

    def fn(params, prompt, prompt_mask, key, sp):
        return sample(
            params,
            model,
            prompt,
            prompt_mask,
            key,
            sp,
            group=group,
            max_new=max_new,
            eos_id=eos_id,
            pad_id=pad_id,
            with_cache=with_cache,
        )

    return with_rollout_weights(fn, cfg, weights_dtype)
