"""A synthetic token task that shows the device side of GRPO learns, in about a minute of CPU.

Vocabulary: 0 = pad, 1 = EOS (unused: completions have a fixed length), symbols 2 .. V-1 (S = V - 2 of them).
A prompt is a counting run of random start and random length (left-padded): s, s+1, ..., s+n-1 (mod S).
The rule: every completion token continues the count, c_t = c_{t-1} + 1 (mod S), with c_{-1} the last
prompt token. Reward = fraction of completion tokens that follow the rule, so chance is 1/S and the maximum 1.

Everything here is pure JAX: the environment only (prompts and rewards). The GRPO loop that trains on it is
grpo_jax.train.token_loop (`python -m experiments.token_task`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def make_prompts(key: jax.Array, batch: int, prompt_len: int, vocab_size: int):
    """[B, P] left-padded counting prompts and their masks."""
    s = vocab_size - 2
    k1, k2 = jax.random.split(key)
    start = jax.random.randint(k1, (batch, 1), 0, s)
    length = jax.random.randint(k2, (batch, 1), 2, prompt_len + 1)
    idx = jnp.arange(prompt_len)[None, :]
    first = prompt_len - length  # index of the first real token
    tokens = 2 + (start + idx - first) % s
    mask = (idx >= first).astype(jnp.int32)
    return jnp.where(mask > 0, tokens, 0).astype(jnp.int32), mask


def rewards(prompt: jax.Array, completions: jax.Array, vocab_size: int) -> jax.Array:
    """[B, G] fraction of completion tokens continuing the count: c_t = c_{t-1} + 1 (mod S), c_{-1} = p_last.

    Prompts are left-padded, so the prompt's last token is prompt[:, -1]."""
    s = vocab_size - 2
    prev = jnp.concatenate(
        [jnp.broadcast_to(prompt[:, None, -1:], completions.shape[:2] + (1,)), completions[..., :-1]], axis=-1
    )
    ok = (completions >= 2) & ((completions - 2) == (prev - 2 + 1) % s)
    return jnp.mean(ok.astype(jnp.float32), axis=-1)
