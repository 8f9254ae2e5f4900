"""Continuing conversations from their KV cache: the later turns of multi-turn sampling
(grpo_jax.rollout.multiturn) without encoding the earlier turns again.

    rc = rows_from_cache(cache, comp_mask, rows)                  # turn 1's cache -> one row per trajectory
    rc, logits = extend(params, cfg, rc, tokens, mask)           # append a feedback turn [R, F] (one pass)
    out, rc = decode(params, cfg, rc, logits, key, sp, ...)      # the next reply [R, 1, T], appended
    rc = take(rc, rows)                                          # the rows that go on to the next turn

A `RowCache` holds, for each of R rows, the keys and values of every slot seen so far ([R, K, S, Dh] per
layer), which slots hold a real token (`valid` [R, S]: a left-padded prompt's pads, a reply's padding after
its end and a feedback turn's padding are not) and the next RoPE position (`npos` [R], the number of real
tokens). Slots are appended, never moved; keys are stored already rotated, so a slot's place in the buffer
does not matter, only `valid`. Attention over the valid slots with positions counted over them is exactly the
computation of the trainer's forward pass over the packed sequence (prompt | reply | feedback | reply, no
gaps), up to float rounding of the sums: tests/test_continuation.py checks the log-probs against it.
`prefill_rows` builds a RowCache from token contexts (for evaluation, whose first turn keeps no cache).
A sliding-window layer (Mistral, Gemma) sees the keys within its window of the query's position; a slot's
position is the number of valid slots before it (`slot_positions`), as the packed sequence counts them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.sampling import _decode_loop, choose_tokens, rollout_config, with_rollout_weights


class RowCache(NamedTuple):
    k: tuple[jax.Array, ...]  # L arrays [R, K, S, Dh]
    v: tuple[jax.Array, ...]
    valid: jax.Array  # [R, S] bool
    npos: jax.Array  # [R] int32: the next token's position (the real tokens so far)


def rows_from_cache(cache: tfm.KVCache, comp_mask: jax.Array, rows: jax.Array) -> RowCache:
    """The rows `rows` ([R] indices into the B*G samples, problem-major) of a turn-1 sampler cache: the
    prompt's slots then the completion's, `comp_mask` [B, G, T] marking the sampled tokens (up to and
    including EOS)."""
    b, g = comp_mask.shape[:2]
    bi, gi = rows // g, rows % g
    n = len(cache.comp_k)
    k = tuple(jnp.concatenate([cache.prompt_k[i][bi], cache.comp_k[i][bi, gi]], axis=2) for i in range(n))
    v = tuple(jnp.concatenate([cache.prompt_v[i][bi], cache.comp_v[i][bi, gi]], axis=2) for i in range(n))
    cm = comp_mask.reshape(b * g, -1)[rows] > 0
    valid = jnp.concatenate([cache.prompt_mask[bi], cm], axis=1)
    npos = cache.prompt_len[bi] + jnp.sum(cm, axis=1).astype(jnp.int32)
    return RowCache(k, v, valid, npos)


def take(rc: RowCache, rows: jax.Array) -> RowCache:
    """The rows `rows` of a RowCache (the trajectories that go on to another turn)."""
    return jax.tree.map(lambda x: x[rows], rc)


def prefill_rows(params, cfg: tfm.TransformerConfig, ctx: jax.Array, ctx_mask: jax.Array):
    """(RowCache, next-token logits [R, V]) of left-padded token contexts [R, S]."""
    cache, logits = tfm.prefill(params, cfg, ctx, ctx_mask, 1, 0)
    n = cache.prompt_k.shape[0]
    return RowCache(
        tuple(cache.prompt_k[i] for i in range(n)),
        tuple(cache.prompt_v[i] for i in range(n)),
        cache.prompt_mask,
        cache.prompt_len,
    ), logits


def slot_positions(valid: jax.Array) -> jax.Array:
    """[R, S] int32: the position of each slot's token, the number of valid slots before it (slots are
    appended in order, so this is the position the packed sequence gives it; invalid slots: unused)."""
    return jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1


def _layer_contexts(cfg, pos, masks_of):
    """Per attention variant: (RoPE tables of the new tokens' positions `pos` [R, F], the blocks' masks
    masks_of(window)) (unrolled layers: cfg.layer_variant picks a layer's)."""
    return tfm.attention_contexts(
        cfg, lambda window, rope, identity: (tfm.rope_of(cfg, rope, pos, identity), masks_of(window)), False
    )


def _project(cfg, lp, x, pos, dtype):
    """q [R, F, K, g, Dh] and the new tokens' k, v [R, K, F, Dh] of a layer for tokens x [R, F, D]."""
    q, k, v = tfm._qkv(cfg, lp, tfm.norm(cfg, x, lp["attn_norm"]), pos, dtype)
    return q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)


def _finish(cfg, lp, x, q, blocks, dtype):
    """The rest of the layer: attention of q over `blocks` [(keys [R, K, S, Dh], values, mask broadcastable
    to [R, K, g, F, S])] with one joint softmax, the output projection and the MLP."""
    scale = cfg.attn_scale
    sc = [
        tfm._scores(cfg, jnp.einsum("rtkgd,rksd->rkgts", q, k, preferred_element_type=jnp.float32) * scale)
        for k, _, _ in blocks
    ]
    w = tfm._softmax_attend(sc, [m for _, _, m in blocks])
    o = sum(
        jnp.einsum("rkgts,rksd->rtkgd", wi.astype(dtype), v) for wi, (_, v, _) in zip(w, blocks, strict=True)
    )
    return tfm._mlp(cfg, lp, tfm._out_proj(cfg, lp, x, o, dtype), dtype)


def extend(params, cfg: tfm.TransformerConfig, rc: RowCache, tokens: jax.Array, mask: jax.Array):
    """Append F tokens per row ([R, F], real where `mask`, right-padded) in one pass; returns the RowCache
    with F more slots and the logits [R, V] after each row's last real token (rows without one: undefined)."""
    dtype = tfm._dt(cfg.compute_dtype)
    m = mask.astype(bool)
    f = tokens.shape[1]
    pos = rc.npos[:, None] + jnp.maximum(jnp.cumsum(m, axis=1) - 1, 0).astype(jnp.int32)
    old = rc.valid[:, None, None, None, :]
    own = jnp.tril(jnp.ones((f, f), bool))[None, None, None] & m[:, None, None, None, :]

    def masks(window):  # (old slots, own tokens) as seen by a layer with this sliding window
        if window is None:
            return old, own
        qp = pos[:, None, None, :, None]  # [R,1,1,F,1]
        kp = slot_positions(rc.valid)[:, None, None, None, :]
        kq = jnp.swapaxes(qp, -1, -2)  # the new tokens as keys [R,1,1,1,F]
        return old & tfm.within_window(qp, kp, window), own & tfm.within_window(qp, kq, window)

    contexts = _layer_contexts(cfg, pos, masks)
    x = tfm.embed_tokens(cfg, params, tokens, dtype)
    ks, vs = [], []
    for i, lp in enumerate(tfm.split_layers(params)):
        rot, (old_i, own_i) = contexts[cfg.layer_variant[i]]
        q, k, v = _project(cfg, lp, x, rot, dtype)
        x = _finish(cfg, lp, x, q, [(rc.k[i], rc.v[i], old_i), (k, v, own_i)], dtype)
        ks.append(jnp.concatenate([rc.k[i], k.astype(rc.k[i].dtype)], axis=2))
        vs.append(jnp.concatenate([rc.v[i], v.astype(rc.v[i].dtype)], axis=2))
    n = jnp.sum(m, axis=1).astype(jnp.int32)
    logits, _ = tfm._head(cfg, params, x[jnp.arange(x.shape[0]), jnp.maximum(n - 1, 0)])
    return RowCache(tuple(ks), tuple(vs), jnp.concatenate([rc.valid, m], axis=1), rc.npos + n), logits


def decode(params, cfg, rc: RowCache, logits, key, sp, *, max_new: int, eos_id, pad_id: int, choose):
    """Sample one reply of up to max_new tokens per row, continuing the rows' conversations: (SampleOutput
    [R, 1, T], the RowCache with T more slots, the reply's tokens valid). `choose(logits, key, sp)` is the
    sampler's token choice (grpo_jax.policies.sampling.choose_tokens); token t draws with fold_in(key, t), as
    the first turn's sampler."""
    dtype = rc.k[0].dtype
    r, kh, s0, dh = rc.k[0].shape
    pad = jnp.zeros((r, kh, max_new, dh), dtype)
    ks = tuple(jnp.concatenate([x, pad], axis=2) for x in rc.k)
    vs = tuple(jnp.concatenate([x, pad], axis=2) for x in rc.v)
    valid = jnp.concatenate([rc.valid, jnp.zeros((r, max_new), bool)], axis=1)
    layers = tfm.split_layers(params)
    slots = jnp.arange(s0 + max_new)
    cdt = tfm._dt(cfg.compute_dtype)

    # each slot's position: the kept slots' as counted over them, reply token j at npos + j
    kpos = jnp.concatenate([slot_positions(rc.valid), rc.npos[:, None] + jnp.arange(max_new)], axis=1)

    def step(cache, tok, t):  # token t of every row ([R, 1]) into slot s0 + t
        nk, nv = list(cache[0]), list(cache[1])
        pos = (rc.npos + t)[:, None]
        mask = (valid | ((slots >= s0) & (slots <= s0 + t))[None])[:, None, None, None, :]

        def masks(window):
            near = tfm.within_window(pos, kpos, window)
            return mask if window is None else mask & near[:, None, None, None]

        contexts = _layer_contexts(cfg, pos, masks)
        x = tfm.embed_tokens(cfg, params, tok, cdt)  # [R,1,D]
        for i, lp in enumerate(layers):
            rot, mask_i = contexts[cfg.layer_variant[i]]
            q, k, v = _project(cfg, lp, x, rot, cdt)
            nk[i] = jax.lax.dynamic_update_slice(nk[i], k.astype(dtype), (0, 0, s0 + t, 0))
            nv[i] = jax.lax.dynamic_update_slice(nv[i], v.astype(dtype), (0, 0, s0 + t, 0))
            x = _finish(cfg, lp, x, q, [(nk[i], nv[i], mask_i)], cdt)
        lg, _ = tfm._head(cfg, params, x[:, 0])
        return (tuple(nk), tuple(nv)), lg[:, None]

    out, (ks, vs) = _decode_loop(
        (ks, vs),
        logits[:, None],
        lambda lg, t: choose(lg, jax.random.fold_in(key, t), sp),
        step,
        max_new=max_new,
        eos_id=eos_id,
        pad_id=pad_id,
        with_cache=True,
    )
    valid = jnp.concatenate([rc.valid, out.mask[:, 0] > 0], axis=1)
    return out, RowCache(ks, vs, valid, rc.npos + out.lengths[:, 0])


class Continuer(NamedTuple):
    """The jitted later-turn samplers of one model and reply length (`make_continuer`)."""

    extend_decode: object  # (params, rc, tokens [R, F], mask, key, sp) -> (SampleOutput [R, 1, T], RowCache)
    from_tokens: object  # (params, ctx [R, S], ctx_mask, key, sp) -> (SampleOutput, RowCache)


@functools.lru_cache(maxsize=64)
def make_continuer(
    cfg: tfm.TransformerConfig, *, max_new: int, eos_id, pad_id: int, weights_dtype: str = "float32"
) -> Continuer:
    """The jitted functions of a later turn: a feedback turn appended to a RowCache and the next reply
    sampled, or the reply sampled after token contexts encoded from scratch (evaluation's second turn).
    `weights_dtype` as in `sampling.make_sampler` (a RowCache must come from a sampler of the same dtype)."""
    kw = dict(max_new=max_new, eos_id=eos_id, pad_id=pad_id, choose=choose_tokens)
    model = rollout_config(cfg, weights_dtype)

    def extend_decode(params, rc, tokens, mask, key, sp):
        rc, logits = extend(params, model, rc, tokens, mask)
        return decode(params, model, rc, logits, key, sp, **kw)

    def from_tokens(params, ctx, ctx_mask, key, sp):
        rc, logits = prefill_rows(params, model, ctx, ctx_mask)
        return decode(params, model, rc, logits, key, sp, **kw)

    return Continuer(
        with_rollout_weights(extend_decode, cfg, weights_dtype),
        with_rollout_weights(from_tokens, cfg, weights_dtype),
    )
