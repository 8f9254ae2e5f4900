"""The padding-free update: a batch's sequences packed into rows of N tokens (`--pack_tokens=N`).

The padded update (transformer.forward_grouped) computes every prompt at its padded width P and every
completion at the batch's full width T (a multi-turn trajectory at K*T + (K-1)*F), whatever their lengths.
Packed, each row holds BLOCKS back to back, a block being one prompt (its real tokens) followed by some of
that prompt's completions (their real tokens, feedback turns of a trajectory included):

    row r:  [prompt b | completion (b, 0) | completion (b, 1) | ...][prompt b' | completion (b', 0) | ...]

so a prompt is encoded once per row it appears in (the shared-prompt encoding, as forward_grouped has it per
group) and nothing is computed for padding beyond the end of the last block. Attention: a token attends to
the tokens of its own block that come before it and are its prompt or its own completion (query i, key j:
block_i = block_j > 0, j <= i, and segment_j = segment_i or j is a prompt token); positions restart per
block: the prompt at 0 .. p-1, each completion at p .. p+L-1, as in forward_grouped and the sampler. The
hidden state that predicts completion token t is its predecessor's (token t-1 of the same completion, or the
block's last prompt token for t = 0), gathered (`pred`), so the LM head runs once per packed position; the
per-token log-probs and entropies are then gathered back (`unpack`) into the padded [B, G, T] layout, where
the loss, the advantages and every metric are computed exactly as for the padded update (tests/test_packed.py:
values and gradients equal within float32 rounding; a mask that lets attention cross a segment fails it).

`plan` is host side (numpy): one layout per micro-batch (the train step's strided split: micro-batch i holds
the groups b with b mod n = i), all with the same number of rows R, rounded up to a size of `row_bucket`
(few compiled shapes). Sequences are placed in order (next fit): a completion that does not fit the row
starts a new row with a copy of its prompt. A completion's packed length is up to its last token of the loss
mask (a trajectory's feedback turns inside it are context: packed, never trained on).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.logp import chunked_token_logp


class PackedLayout(NamedTuple):
    """Packed rows of one or more micro-batches (leading axes [n] when stacked; here for one)."""

    tokens: jax.Array  # [R, N] int32 (pad elsewhere)
    positions: jax.Array  # [R, N] int32 RoPE positions (restart per block)
    block: jax.Array  # [R, N] int32: block id within the row, 1.. (0 = padding)
    segment: jax.Array  # [R, N] int32: 1 for the block's prompt, 2.. for its completions (0 = padding)
    pred: jax.Array  # [R * N] int32: flat index of the hidden state that predicts each position's token
    unpack: jax.Array  # [B, G, T] int32: flat packed index of completion token t of (b, g) (0 beyond it)


def row_bucket(rows: int, multiple: int = 1) -> int:
    """The packed batch's row count for `rows` needed rows: the smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ...
    (2^k and 3 * 2^(k-1)) that holds them, rounded up to a multiple of `multiple` (the data-parallel
    devices)."""
    r = max(1, int(rows))
    size = min(c for k in range(64) for c in (2**k, 3 * 2**k) if c >= r)
    return -(-size // multiple) * multiple


def completion_lengths(completion_mask: np.ndarray) -> np.ndarray:
    """[..., G] packed length of each completion: up to and including its last loss-mask token (0: none)."""
    m = np.asarray(completion_mask) > 0
    t = m.shape[-1]
    last = t - np.argmax(m[..., ::-1], axis=-1)
    return np.where(m.any(-1), last, 0)


class PlanStats(NamedTuple):
    rows: int  # R (after rounding) per micro-batch
    needed: int  # rows the sequences filled (most over the micro-batches)
    tokens: int  # packed real tokens, all micro-batches (prompt copies included)
    capacity: int  # n * R * N


def _place(prompt_len, lengths, width):
    """Next-fit placement of one micro-batch: (rows, [(row, start, b, g | -1 for the prompt)])."""
    spans, row, used, open_b = [], 0, 0, -1
    for b, p in enumerate(prompt_len):
        for g, n in enumerate(lengths[b]):
            if n == 0:
                continue
            need = n if open_b == b else p + n
            if used + need > width:
                row, used, open_b, need = row + 1, 0, -1, p + n
            if open_b != b:
                spans.append((row, used, b, -1))
                used += p
                open_b = b
            spans.append((row, used, b, g))
            used += n
    return (row + 1 if spans else 0), spans


def plan(
    prompt: np.ndarray,
    prompt_mask: np.ndarray,
    completions: np.ndarray,
    completion_mask: np.ndarray,
    width: int,
    *,
    parts: int = 1,
    rows_multiple: int = 1,
    pad_id: int = 0,
) -> tuple[PackedLayout, PlanStats]:
    """The packed layouts of a batch (prompt [B, P] left-padded, completions [B, G, T]) split into `parts`
    micro-batches (groups b with b mod parts = i): arrays stacked [parts, ...], R rows of `width` each."""
    prompt, pmask = np.asarray(prompt), np.asarray(prompt_mask) > 0
    comps = np.asarray(completions)
    b_all, g_all, t_all = comps.shape
    if b_all % parts:
        raise ValueError(f"packed.plan: {b_all} prompts do not split into {parts} micro-batches")
    plens = pmask.sum(1)
    lengths = completion_lengths(completion_mask)
    longest = int((plens[:, None] + lengths).max(initial=0))
    if longest > width:
        raise ValueError(
            f"packed.plan: a prompt + completion of {longest} tokens does not fit rows of {width}"
        )
    placed = [_place(plens[i::parts], lengths[i::parts], width) for i in range(parts)]
    needed = max(1, max(r for r, _ in placed))
    rows = row_bucket(needed, rows_multiple)
    shape = (parts, rows, width)
    tokens = np.full(shape, pad_id, np.int32)
    positions, block, segment = (np.zeros(shape, np.int32) for _ in range(3))
    pred = np.zeros((parts, rows * width), np.int32)
    unpack = np.zeros((parts, b_all // parts, g_all, t_all), np.int32)
    for i, (_, spans) in enumerate(placed):
        sub_p, sub_c = prompt[i::parts], comps[i::parts]
        sub_m, sub_len = pmask[i::parts], lengths[i::parts]
        blk = np.zeros(rows, np.int32)
        last_prompt = 0
        for row, start, b, g in spans:
            if g < 0:  # a block opens: its prompt's real tokens at positions 0 .. p-1
                blk[row] += 1
                ids = sub_p[b][sub_m[b]]
                sl = slice(start, start + ids.size)
                tokens[i, row, sl], positions[i, row, sl] = ids, np.arange(ids.size)
                block[i, row, sl], segment[i, row, sl] = blk[row], 1
                pred[i, row * width + start : row * width + start + ids.size] = (
                    row * width + start + np.arange(ids.size)
                )
                last_prompt, p_len, seg = row * width + start + ids.size - 1, ids.size, 1
                continue
            n = sub_len[b, g]
            seg += 1
            sl = slice(start, start + n)
            flat = row * width + start + np.arange(n)
            tokens[i, row, sl], positions[i, row, sl] = sub_c[b, g, :n], p_len + np.arange(n)
            block[i, row, sl], segment[i, row, sl] = blk[row], seg
            pred[i, flat] = np.r_[last_prompt, flat[:-1]]
            unpack[i, b, g, :n] = flat
    tokens_used = int(sum(np.count_nonzero(block[i]) for i in range(parts)))
    layout = PackedLayout(tokens, positions, block, segment, pred, unpack)
    return layout, PlanStats(rows, needed, tokens_used, parts * rows * width)


def allowed(layout: PackedLayout) -> jax.Array:
    """[R, 1, 1, N, N] bool: query i may attend key j (same block, j <= i, j in the prompt or i's segment)."""
    blk, seg = layout.block, layout.segment
    n = blk.shape[-1]
    causal = jnp.tril(jnp.ones((n, n), bool))
    same_block = (blk[:, :, None] == blk[:, None, :]) & (blk[:, :, None] > 0)
    visible = (seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 1)
    return (causal[None] & same_block & visible)[:, None, None]


def packed_policy_fn(cfg: tfm.TransformerConfig):
    """`fn(params, layout, temperature) -> (logp, entropy[, values])` in the padded layout [B, G, T] of the
    layout's `unpack`, computed over the packed rows (the train step's policy function with --pack_tokens;
    the chunked head when cfg.logp_chunk > 0, values with a value head)."""

    def fn(params, layout: PackedLayout, temperature):
        hidden, values = tfm.forward_masked(
            params, cfg, layout.tokens, layout.positions, allowed(layout), return_hidden=True
        )
        d = hidden.shape[-1]
        h = hidden.reshape(-1, d)[layout.pred]  # each position's predicting hidden state
        tgt = layout.tokens.reshape(-1)
        w = tfm.head_weight(params, cfg)  # [D, V]
        if cfg.logp_chunk:
            if cfg.tie_embeddings:
                logp, ent = chunked_token_logp(
                    h, w.T, tgt, temperature, chunk=cfg.logp_chunk, vocab_major=True
                )
            else:
                logp, ent = chunked_token_logp(h, w, tgt, temperature, chunk=cfg.logp_chunk)
        else:
            logits = jnp.matmul(h, w.astype(h.dtype), preferred_element_type=jnp.float32)
            logp, ent = tfm.token_logp(logits, tgt, temperature)
        out = (logp[layout.unpack], ent[layout.unpack])
        if cfg.value_head:
            out += (values.reshape(-1)[layout.pred][layout.unpack],)
        return out

    return fn
