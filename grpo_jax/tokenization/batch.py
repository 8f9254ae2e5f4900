"""Between text and the model's token arrays (no JAX; numpy in and out):

    prompt, mask = pad_prompts(tok, prompts)             # left-padded [B, P] int32: what the sampler eats
    texts = decode_completions(tok, tokens, mask)        # the sampler's [B, G, T] output back to text

A prompt is a string (encoded as it is) or a chat, a list of {"role", "content"} messages, rendered through
the tokenizer's chat template with the generation prompt (the template writes the special tokens itself). A
completion's text ends before the first of the tokenizer's end-of-generation ids (`stop_ids`: an instruct
model's end-of-turn token included; the ids the sampler stops at).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_jax.tokenization.base import Tokenizer


def stop_ids(tok: Tokenizer) -> tuple[int, ...]:
    """Every id that ends a generation (a real tokenizer's eos_ids; the procedural tokenizer's EOS)."""
    return tuple(getattr(tok, "eos_ids", None) or (tok.eos_id,))


def pad_prompts(
    tok: Tokenizer, prompts: Sequence[str | Sequence[Mapping[str, Any]]], max_len: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask), int32 [B, P], left-padded with tok.pad_id to `max_len` (default: the longest prompt).
    Each prompt is a string or a chat (a list of messages, rendered with the chat template and the generation
    prompt). ValueError names a prompt longer than max_len."""
    rows = []
    for p in prompts:
        text = p if isinstance(p, str) else tok.apply_chat_template(list(p), add_generation_prompt=True)
        rows.append(tok.encode(text))
    width = max((len(r) for r in rows), default=0) if max_len is None else int(max_len)
    ids = np.full((len(rows), width), tok.pad_id, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"pad_prompts: prompt {i} has {len(row)} tokens, more than max_len={width}")
        if row:
            ids[i, width - len(row) :] = row
            mask[i, width - len(row) :] = 1
    return ids, mask


def decode_completions(tok: Tokenizer, tokens, mask) -> list[str]:
    """Text of each row of tokens [N, T] (or [B, G, T], flattened row-major): the masked tokens up to (not
    including) the first of the tokenizer's end-of-generation ids, special tokens and ids outside the
    tokenizer's vocabulary (a model's padded embedding rows, e.g. Qwen2.5's 151 936 rows for 151 665 tokens)
    skipped."""
    tokens = np.asarray(tokens)
    mask = np.asarray(mask)
    tokens = tokens.reshape(-1, tokens.shape[-1])
    mask = mask.reshape(-1, mask.shape[-1])
    stops = np.asarray(stop_ids(tok))
    out = []
    for row, m in zip(tokens, mask, strict=True):
        ids = row[m > 0]
        eos = np.flatnonzero(np.isin(ids, stops))
        if eos.size:
            ids = ids[: eos[0]]
        ids = ids[ids < tok.vocab_size]  # padded embedding rows past the vocabulary decode to ""
        out.append(tok.decode(ids.tolist(), skip_special=True))
    return out
