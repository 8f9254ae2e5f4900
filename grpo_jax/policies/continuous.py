"""The device side of the continuous-batching engine: R decode slots, each holding one sample at a time.

A slot holds its sample's prompt (keys and values copied in from the prompt's one encoding when the sample
is inserted), the keys and values of the tokens the sample has drawn, its next RoPE position, its own PRNG
key and the logits of its next token. A decode step feeds one token per slot; a slot whose sample ends (an
end-of-generation id, or `max_new` tokens) stops, and the host (grpo_jax.rollout.engines.ContinuousEngine)
inserts the next pending sample into it, or, once nothing is pending, moves the slots still running into a
smaller batch (`take`), so that finished samples cost nothing more.

Cache layout, per layer: k, v [R, K, C, Dh] float32, C = P + T. Columns [0, P) hold the sample's left-padded
prompt (its pads not `valid`); columns [P, P + T) are a ring of T completion columns: at the engine's global
decode step t every slot writes column P + (t mod T) (one in-place dynamic_update_slice for all slots, as the
static sampler writes). A sample that starts at step t0 writes its token j at column P + ((t0 + j) mod T),
never a column it still needs (it ends within T tokens); inserting a sample invalidates the slot's earlier
columns. Keys are stored rotated at the sample's own positions, so where a column lies does not matter, only
`valid` does: the attention of a slot is the attention of the trainer's forward pass over prompt + tokens
so far (tests/test_engines.py checks the behaviour log-probs against it). A sliding-window layer (Mistral,
Gemma) also needs each column's position (`pos`): it attends to the columns whose position is within the
window of the query's.

Token choice: token j of a sample draws with the uniforms of fold_in(sample key, j) (`row_uniforms`), so a
sample's tokens depend on its key, its prompt and the weights only, not on the slot, the slot count or the
other samples (up to float rounding of the batched products; tests/test_engines.py). Everything else of the
choice (temperature, top-k / top-p, greedy, the behaviour log-probs) is the static sampler's `choose_tokens`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.sampling import SamplingParams, choose_tokens

# the rollout engines (grpo_jax.rollout.engines): the static batch sampler of grpo_jax.policies.sampling and
# the continuous-batching slots of this module (the config's --rollout_engine choices)
ROLLOUT_ENGINES = ("static", "continuous")


class PromptCache(NamedTuple):
    """The B prompts of a call, encoded once: per layer k, v [B, K, P, Dh] (compute dtype), the prompt mask
    [B, P], the number of real tokens [B] and the logits of the first new token [B, V]."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask: jax.Array
    length: jax.Array
    logits: jax.Array


class Slots(NamedTuple):
    k: tuple[jax.Array, ...]  # L arrays [R, K, C, Dh] float32 (C = P + T)
    v: tuple[jax.Array, ...]
    valid: jax.Array  # [R, C] bool: the columns that hold the slot's sample
    pos: jax.Array  # [R, C] int32: each column's RoPE position (read by sliding-window layers)
    npos: jax.Array  # [R] int32: RoPE position of the next token fed (real tokens so far)
    n: jax.Array  # [R] int32: tokens the slot's sample has drawn
    active: jax.Array  # [R] bool
    keys: jax.Array  # [R, 2] uint32: the sample's key (raw)
    logits: jax.Array  # [R, V] float32: the next token's logits
    t: jax.Array  # [] int32: the global decode step (the ring column)


def init_slots(cfg: tfm.TransformerConfig, rows: int, prompt_len: int, max_new: int) -> Slots:
    """R idle slots for prompts of P tokens and samples of up to T new tokens."""
    c = prompt_len + max_new
    shape = (rows, cfg.n_kv_heads, c, cfg.dim_head)
    zeros = tuple(jnp.zeros(shape, jnp.float32) for _ in range(cfg.n_layers))
    return Slots(
        k=zeros,
        v=tuple(jnp.zeros(shape, jnp.float32) for _ in range(cfg.n_layers)),
        valid=jnp.zeros((rows, c), bool),
        pos=jnp.zeros((rows, c), jnp.int32),
        npos=jnp.zeros((rows,), jnp.int32),
        n=jnp.zeros((rows,), jnp.int32),
        active=jnp.zeros((rows,), bool),
        keys=jnp.zeros((rows, 2), jnp.uint32),
        logits=jnp.zeros((rows, cfg.vocab_size), jnp.float32),
        t=jnp.zeros((), jnp.int32),
    )


def prompt_cache(
    params, cfg: tfm.TransformerConfig, prompt: jax.Array, prompt_mask: jax.Array
) -> PromptCache:
    """Encode left-padded prompts [B, P] once (transformer.prefill)."""
    layers = tfm.split_layers(params) if jnp.dtype(cfg.compute_dtype) != jnp.float32 else None
    cache, logits = tfm.prefill(params, cfg, prompt, prompt_mask, 1, 0, layers=layers)
    n = cache.prompt_k.shape[0]
    return PromptCache(
        tuple(cache.prompt_k[i] for i in range(n)),
        tuple(cache.prompt_v[i] for i in range(n)),
        cache.prompt_mask,
        cache.prompt_len,
        logits.astype(jnp.float32),
    )


def sample_keys(key: jax.Array, n: int) -> jax.Array:
    """[n, 2] uint32: the raw keys of samples 0..n-1 of a call with `key` (raw or typed): fold_in(key, i)."""
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n, dtype=jnp.uint32))
    return jax.random.key_data(keys) if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) else keys


def insert(
    slots: Slots, pc: PromptCache, slot_idx: jax.Array, prompt_idx: jax.Array, keys: jax.Array
) -> Slots:
    """Start samples in slots `slot_idx` [M] (an index >= R is dropped: padding), sample m of prompt
    `prompt_idx[m]` with key `keys[m]`: the prompt's keys and values copied into the slot's prompt columns,
    its completion columns invalidated, its first token's logits the prompt's."""
    p = pc.mask.shape[1]
    t_cols = slots.valid.shape[1] - p
    k = tuple(
        a.at[slot_idx, :, :p].set(b[prompt_idx].astype(a.dtype), mode="drop")
        for a, b in zip(slots.k, pc.k, strict=True)
    )
    v = tuple(
        a.at[slot_idx, :, :p].set(b[prompt_idx].astype(a.dtype), mode="drop")
        for a, b in zip(slots.v, pc.v, strict=True)
    )
    cols = jnp.concatenate([pc.mask[prompt_idx] > 0, jnp.zeros((prompt_idx.shape[0], t_cols), bool)], axis=1)
    ppos = tfm.prompt_positions(pc.mask[prompt_idx] > 0)
    pos = jnp.concatenate([ppos, jnp.zeros((prompt_idx.shape[0], t_cols), jnp.int32)], axis=1)
    return slots._replace(
        k=k,
        v=v,
        valid=slots.valid.at[slot_idx].set(cols, mode="drop"),
        pos=slots.pos.at[slot_idx].set(pos, mode="drop"),
        npos=slots.npos.at[slot_idx].set(pc.length[prompt_idx], mode="drop"),
        n=slots.n.at[slot_idx].set(0, mode="drop"),
        active=slots.active.at[slot_idx].set(True, mode="drop"),
        keys=slots.keys.at[slot_idx].set(keys, mode="drop"),
        logits=slots.logits.at[slot_idx].set(pc.logits[prompt_idx], mode="drop"),
    )


def take(slots: Slots, rows: jax.Array) -> Slots:
    """The slots `rows` [R'] as a batch of R' slots (the engine's smaller batch once nothing is pending)."""
    t = slots.t
    out = jax.tree.map(lambda x: x[rows], slots._replace(t=jnp.zeros((slots.n.shape[0],), jnp.int32)))
    return out._replace(t=t)


def row_uniforms(keys: jax.Array, n: jax.Array) -> jax.Array:
    """[2, R] the uniforms in (0, 1] of each row's next draw: fold_in(its sample key, its token index)."""
    u = jax.vmap(lambda k, i: jax.random.uniform(jax.random.fold_in(k, i), (2,), jnp.float32))(keys, n)
    return 1.0 - u.T


def _attend(
    q: jax.Array, ck: jax.Array, cv: jax.Array, valid: jax.Array, scale: float, cap: float | None = None
) -> jax.Array:
    """One query per slot, q [R, 1, K, g, Dh], over the slot's columns ck / cv [R, K, C, Dh] where `valid`
    [R, C], in float32, as multiply-and-reduce loops: XLA:CPU runs these one-row products ~3x faster than
    batched dots of [g, Dh] x [Dh, C] (SmolLM2, 32 slots x 832 columns: the decode step 113 against 248 ms;
    WORKSPACE.md section 6). `cap`: the scores' soft-cap (Gemma 2). Returns [R, 1, K, g, Dh] float32."""
    qf = q[:, 0].astype(jnp.float32)  # [R, K, g, Dh]
    s = jnp.sum(qf[:, :, :, None, :] * ck[:, :, None].astype(jnp.float32), axis=-1) * scale  # [R, K, g, C]
    if cap is not None:
        s = tfm.softcap(s, cap)
    (w,) = tfm._softmax_attend([s], [valid[:, None, None, :]])
    return jnp.sum(w[..., None] * cv[:, :, None].astype(jnp.float32), axis=-2)[:, None]


def decode_step(params, cfg: tfm.TransformerConfig, slots: Slots, tok: jax.Array, layers, prompt_len: int):
    """Feed token `tok` [R] of every slot at its own position; its keys and values go to this step's ring
    column (valid for the active slots). Returns (slots, logits [R, V] of each slot's next token)."""
    dtype = tfm._dt(cfg.compute_dtype)
    c = slots.valid.shape[1]
    col = prompt_len + slots.t % (c - prompt_len)
    valid = jax.lax.dynamic_update_slice(slots.valid, slots.active[:, None], (0, col))
    pos = jax.lax.dynamic_update_slice(slots.pos, slots.npos[:, None], (0, col))

    def context(window, rope, identity):  # (RoPE tables, valid columns) of a layer variant
        seen = valid if window is None else valid & tfm.within_window(slots.npos[:, None], pos, window)
        return tfm.rope_of(cfg, rope, slots.npos[:, None], identity), seen

    contexts = tfm.attention_contexts(cfg, context, stacked=False)
    x = tfm.embed_tokens(cfg, params, tok, dtype)[:, None, :]
    scale = cfg.attn_scale
    ks, vs = list(slots.k), list(slots.v)
    for i, lp in enumerate(layers):
        rot, seen = contexts[cfg.layer_variant[i]]
        q, k, v = tfm._qkv(cfg, lp, tfm.norm(cfg, x, lp["attn_norm"]), rot, dtype)
        ks[i] = jax.lax.dynamic_update_slice(ks[i], jnp.swapaxes(k, 1, 2).astype(ks[i].dtype), (0, 0, col, 0))
        vs[i] = jax.lax.dynamic_update_slice(vs[i], jnp.swapaxes(v, 1, 2).astype(vs[i].dtype), (0, 0, col, 0))
        o = _attend(q, ks[i], vs[i], seen, scale, cfg.attn_softcap)
        x = tfm._mlp(cfg, lp, tfm._out_proj(cfg, lp, x, o.astype(dtype), dtype), dtype)
    logits, _ = tfm._head(cfg, params, x[:, 0])
    return slots._replace(k=tuple(ks), v=tuple(vs), valid=valid, pos=pos), logits.astype(jnp.float32)


class Chunk(NamedTuple):
    """What one `decode_chunk` drew, per slot and step: tokens [R, S] (pad where inactive), behaviour
    log-probs [R, S] (0 where inactive) and mask [R, S] (1 where the slot's sample drew that token)."""

    tokens: jax.Array
    logp: jax.Array
    mask: jax.Array


def decode_chunk(
    params,
    cfg: tfm.TransformerConfig,
    slots: Slots,
    sp: SamplingParams,
    *,
    steps: int,
    prompt_len: int,
    max_new: int,
    eos_id: tuple[int, ...],
    pad_id: int,
) -> tuple[Slots, Chunk]:
    """Up to `steps` decode steps of every slot (a `lax.while_loop` that stops early once no slot is active):
    each active slot draws its next token (`choose_tokens` with its row's uniforms), ends at an
    end-of-generation id or at its `max_new`-th token, and feeds the token (`decode_step`)."""
    layers = tfm.split_layers(params)  # once, outside the loop
    r = slots.n.shape[0]
    eos = jnp.asarray(eos_id, jnp.int32).reshape(-1)
    out0 = Chunk(
        jnp.full((r, steps), pad_id, jnp.int32),
        jnp.zeros((r, steps), jnp.float32),
        jnp.zeros((r, steps), jnp.float32),
    )

    def cond(c):
        i, s, _ = c
        return (i < steps) & jnp.any(s.active)

    def body(c):
        i, s, out = c
        tok, lp = choose_tokens(s.logits, None, sp, uniforms=row_uniforms(s.keys, s.n))
        tok = jnp.where(s.active, tok, pad_id)
        out = Chunk(
            jax.lax.dynamic_update_slice(out.tokens, tok[:, None], (0, i)),
            jax.lax.dynamic_update_slice(out.logp, jnp.where(s.active, lp, 0.0)[:, None], (0, i)),
            jax.lax.dynamic_update_slice(out.mask, s.active.astype(jnp.float32)[:, None], (0, i)),
        )
        done = s.active & (jnp.isin(tok, eos) | (s.n + 1 >= max_new))
        s, logits = decode_step(params, cfg, s, tok, layers, prompt_len)
        act = s.active.astype(jnp.int32)
        s = s._replace(logits=logits, n=s.n + act, npos=s.npos + act, active=s.active & ~done, t=s.t + 1)
        return i + 1, s, out

    _, slots, out = jax.lax.while_loop(cond, body, (jnp.int32(0), slots, out0))
    return slots, out
