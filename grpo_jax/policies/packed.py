"""The padding-free update: a batch's completions packed into rows of N tokens (`--pack_tokens=N`).

The padded update (transformer.forward_grouped) encodes each prompt once for its group and computes every
completion at the batch's full width T (a multi-turn trajectory at K*T + (K-1)*F), whatever its length.
Packed, the prompts are still encoded once per group ([B, P], as forward_grouped does), and the completions
are placed back to back into rows of N tokens, each row holding completions of ONE group (its real tokens;
a multi-turn trajectory's feedback turns included):

    prompts:  [prompt 0] [prompt 1] ...                       (encoded once, keys / values shared)
    row r:    [completion (b, 3) | completion (b, 0) | completion (b, 5)]  + pads     (group[r] = b)

Attention (transformer.shared_prompt_layers, the same layer as the padded update's): a completion token
attends to its group's real prompt tokens (the row gathers group[r]'s prompt keys and values) and to the
tokens of its own completion that come before it (query i, key j of the row: segment_i = segment_j > 0,
j <= i), never to another completion of the row. Positions: completion token t at p_b + t, as in
forward_grouped and the sampler. The hidden state that predicts completion token t is its predecessor's
(token t-1 of the same completion, or the group's last prompt position for t = 0), gathered (`pred`, an index
into [the B last prompt states ; the R * N row states]), so the LM head runs once per packed position; the
per-token log-probs and entropies are then gathered back (`unpack`) into the padded [B, G, T] layout, where
the loss, the advantages and every metric are computed exactly as for the padded update
(tests/test_packed.py: values and gradients equal within float32 rounding; a mask that lets attention cross
a completion, or a row read another group's prompt, fails it).

Cost: attention per completion token is P + N keys (the padded update's P + T), and the projections, the MLP
and the head run on R * N positions instead of B * G * T; N only has to hold the longest completion.

`plan` is host side (numpy): one layout per micro-batch (the train step's strided split: micro-batch i holds
the groups b with b mod n = i), all with the same number of rows R, rounded up to a size of `row_bucket`
(few compiled shapes). Each group's completions are placed longest first into the first of its rows with
room (first-fit decreasing), so a group's rows are full but for its last. A completion's packed length is up
to its last token of the loss mask (a trajectory's feedback turns inside it are context: packed, never
trained on); one longer than N is refused.
"""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.logp import head_token_logp

A = TypeVar("A", jax.Array, np.ndarray)


class PackedLayout(NamedTuple, Generic[A]):
    """Packed rows of one micro-batch's completions (leading axis [n] when stacked over micro-batches).
    `plan` builds it of host arrays (PackedLayout[np.ndarray]); inside the jitted step its leaves are jax
    arrays (PackedLayout[jax.Array])."""

    tokens: A  # [R, N] int32 (pad elsewhere)
    positions: A  # [R, N] int32 RoPE positions (p_b + t)
    group: A  # [R] int32: the group (prompt) whose completions the row holds (0 for empty rows)
    segment: A  # [R, N] int32: 1.. per completion in the row (0 = padding)
    pred: A  # [R * N] int32: the state predicting each token, in [B last prompt states ; R * N rows]
    unpack: A  # [B, G, T] int32: flat packed index of completion token t of (b, g) (0 beyond it)


def row_bucket(rows: int, multiple: int = 1, per_doubling: int = 2) -> int:
    """The packed batch's row count for `rows` needed rows: the smallest size m * 2^j (m in [k, 2k), k =
    `per_doubling`) that holds them, i.e. exact up to 2k and then k sizes per doubling (k = 2: 1, 2, 3, 4,
    6, 8, 12, 16, 24, ..; k = 8: 1 .. 16, 18, 20, .., 32, 36, ..), rounded up to a multiple of `multiple`
    (the data-parallel devices). Each size is one compiled train step: a larger k wastes fewer rows
    (at most 1/k of them) and compiles more shapes over a run."""
    r, k = max(1, int(rows)), int(per_doubling)
    if k < 1:
        raise ValueError(f"packed.row_bucket: per_doubling={per_doubling} must be >= 1")
    size = r if r <= 2 * k else min(m << j for j in range(64) for m in range(k, 2 * k) if m << j >= r)
    return -(-size // multiple) * multiple


def completion_lengths(completion_mask: np.ndarray) -> np.ndarray:
    """[..., G] packed length of each completion: up to and including its last loss-mask token (0: none)."""
    m = np.asarray(completion_mask) > 0
    t = m.shape[-1]
    last = t - np.argmax(m[..., ::-1], axis=-1)
    return np.where(m.any(-1), last, 0)


class PlanStats(NamedTuple):
    rows: int  # R (after rounding) per micro-batch
    needed: int  # rows the completions filled (most over the micro-batches)
    tokens: int  # real tokens: the prompts' and the packed completions'
    capacity: int  # positions the forward computes: B * P (the prompts) + n * R * N (the rows)


def _place(lengths, width):
    """First-fit decreasing placement of one micro-batch's completions, group by group: a list of rows,
    each (group b, [(g, start), ...])."""
    rows = []
    for b, lens in enumerate(lengths):
        mine = []  # this group's rows: [used, [(g, start), ...]]
        for g in sorted((g for g in range(len(lens)) if lens[g] > 0), key=lambda g: -lens[g]):
            n = int(lens[g])
            slot = next((r for r in mine if r[0] + n <= width), None)
            if slot is None:
                slot = [0, []]
                mine.append(slot)
            slot[1].append((g, slot[0]))
            slot[0] += n
        rows += [(b, spans) for _, spans in mine]
    return rows


def plan(
    prompt_mask: np.ndarray,
    completions: np.ndarray,
    completion_mask: np.ndarray,
    width: int,
    *,
    parts: int = 1,
    rows_multiple: int = 1,
    pad_id: int = 0,
    per_doubling: int = 2,
) -> tuple[PackedLayout[np.ndarray], PlanStats]:
    """The packed layouts of a batch's completions [B, G, T] (their prompts' masks [B, P], left-padded)
    split into `parts` micro-batches (groups b with b mod parts = i): arrays stacked [parts, ...], R rows of
    `width` each (R = row_bucket(rows needed, rows_multiple, per_doubling))."""
    pmask = np.asarray(prompt_mask) > 0
    comps = np.asarray(completions)
    b_all, g_all, t_all = comps.shape
    if b_all % parts:
        raise ValueError(f"packed.plan: {b_all} prompts do not split into {parts} micro-batches")
    plens = pmask.sum(1)
    lengths = completion_lengths(completion_mask)
    longest = int(lengths.max(initial=0))
    if longest > width:
        raise ValueError(
            f"packed.plan: a completion of {longest} tokens does not fit rows of {width} (--pack_tokens must "
            "hold the longest completion, a multi-turn trajectory's feedback included)"
        )
    placed = [_place(lengths[i::parts], width) for i in range(parts)]
    needed = max(1, max(len(r) for r in placed))
    rows = row_bucket(needed, rows_multiple, per_doubling)
    bl = b_all // parts
    shape = (parts, rows, width)
    tokens = np.full(shape, pad_id, np.int32)
    positions, segment = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    group = np.zeros((parts, rows), np.int32)
    pred = np.zeros((parts, rows * width), np.int32)
    unpack = np.zeros((parts, bl, g_all, t_all), np.int32)
    for i, placed_i in enumerate(placed):
        sub_c, sub_len, sub_pl = comps[i::parts], lengths[i::parts], plens[i::parts]
        for r, (b, spans) in enumerate(placed_i):
            group[i, r] = b
            for seg, (g, start) in enumerate(spans, 1):
                n = int(sub_len[b, g])
                sl = slice(start, start + n)
                flat = r * width + start + np.arange(n)
                tokens[i, r, sl], positions[i, r, sl] = sub_c[b, g, :n], sub_pl[b] + np.arange(n)
                segment[i, r, sl] = seg
                pred[i, flat] = np.r_[b, bl + flat[:-1]]
                unpack[i, b, g, :n] = flat
    layout = PackedLayout(tokens, positions, group, segment, pred, unpack)
    tokens_real = int(plens.sum() + lengths.sum())
    return layout, PlanStats(rows, needed, tokens_real, pmask.size + parts * rows * width)


def row_masks(layout: PackedLayout[jax.Array], prompt_mask: jax.Array):
    """(c_to_p [R, 1, 1, 1, 1, P], c_self [R, 1, 1, 1, N, N]) bool: a row's token may attend its group's real
    prompt tokens, and key j of its row when j <= i and both are of the same completion."""
    seg = layout.segment
    n = seg.shape[-1]
    causal = jnp.tril(jnp.ones((n, n), bool))
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
    c_to_p = prompt_mask.astype(bool)[layout.group][:, None, None, None, None, :]
    return c_to_p, (causal[None] & same)[:, None, None, None]


def packed_policy_fn(cfg: tfm.TransformerConfig):
    """`fn(params, prompt, prompt_mask, layout, temperature) -> (logp, entropy[, values])` in the padded
    layout [B, G, T] of the layout's `unpack`, computed over the prompts [B, P] and the packed rows (the
    train step's policy function with --pack_tokens; the chunked head when cfg.logp_chunk > 0, values with a
    value head)."""

    def fn(params, prompt, prompt_mask, layout: PackedLayout[jax.Array], temperature):
        c_to_p, c_self = row_masks(layout, prompt_mask)
        xp, xc = tfm.shared_prompt_layers(
            params,
            cfg,
            prompt,
            prompt_mask.astype(bool),
            layout.tokens[:, None],
            layout.positions[:, None],
            c_to_p,
            c_self,
            kv_index=layout.group,
        )
        d = xp.shape[-1]
        states = jnp.concatenate([xp[:, -1], xc.reshape(-1, d)], axis=0)  # [B + R*N, D]
        hidden, values = tfm._head(cfg, params, states[layout.pred], return_hidden=True)
        tgt = layout.tokens.reshape(-1)
        logp, ent = head_token_logp(params, cfg, hidden, tgt, temperature, cfg.logp_chunk)
        out: tuple[jax.Array, ...] = (logp[layout.unpack], ent[layout.unpack])
        if cfg.value_head:
            out += (values[layout.unpack],)
        return out

    return fn
