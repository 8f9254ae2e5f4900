"""Reducing a per-token loss to a scalar (docs/GRPO_MATH.md §1.1 "How the loss is averaged", T4), and the
per-position entropy. Pure jnp."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from grpo_jax.core.metrics import f32

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "constant", "seq_mean", "seq_sum_mean")


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    *,
    mode: str,
    max_len: int | None = None,
    token_count: jax.Array | float | None = None,
    num_seqs: int | None = None,
) -> jax.Array:
    """Reduce a per-token loss to a scalar (docs/GRPO_MATH.md §1.1 "How the loss is averaged", T4).

    per_token, mask: [..., T]; every leading axis is a sequence axis (N = their product, e.g. B·G).
      "seq_mean_token_mean" (DeepSeekMath eq. 3; TRL "grpo"):  (1/N) Σ_i (1/|o_i|) Σ_t ℓ_{i,t}
      "token_mean" (DAPO eq. 12; TRL "dapo"/"bnpo"):           Σ_{i,t} ℓ_{i,t} / Σ_i |o_i|
      "constant" (Dr. GRPO; TRL "dr_grpo"):                    Σ_{i,t} ℓ_{i,t} / (N · max_len)
          max_len is the CONFIGURED max completion length (a Python int), never the observed/padded length.
      "seq_sum_mean" (LUSPO; TRL "luspo"):                     (1/N) Σ_i Σ_t ℓ_{i,t}
      "seq_mean" (GSPO; one term per sequence):                (1/N) Σ_i ℓ_i
          per_token may be [...] (one value per sequence, used as is) or [..., T] holding the sequence value
          broadcast over its tokens (then ℓ_i = its masked mean over T, i.e. the value itself). For [..., T]
          input this is numerically the same as "seq_mean_token_mean".
    N counts every sequence, including fully masked ones (they contribute 0), as TRL's `.mean()` does.
    Zero valid tokens never give NaN (denominators are max(·, 1)).
    token_count: optional override of Σ|o_i| for "token_mean" (e.g. the active-token count of the whole
    accumulated global batch, TRL "dapo", when this call sees only a micro-batch).
    num_seqs: optional override of N for every other mode (the whole batch's sequence count when this call
    sees one micro-batch of it): the micro-batches' losses then SUM to the whole batch's.
    """
    m = jnp.asarray(mask, jnp.float32)
    x = f32(per_token)
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregate: unknown mode {mode!r}; valid modes are {AGGREGATIONS}.")
    n_seq = max(int(m[..., 0].size), 1) if num_seqs is None else int(num_seqs)  # static
    if n_seq < 1:
        raise ValueError(f"aggregate: num_seqs={num_seqs} must be >= 1")
    if mode == "seq_mean" and x.ndim == m.ndim - 1:
        chex.assert_shape(x, m.shape[:-1])
        return x.sum() / n_seq
    chex.assert_equal_shape([x, m])
    if mode in ("seq_mean_token_mean", "seq_mean"):
        per_seq = (x * m).sum(-1) / jnp.maximum(m.sum(-1), 1.0)  # [...]
        return per_seq.sum() / n_seq
    if mode == "token_mean":
        denom = m.sum() if token_count is None else f32(token_count)
        return (x * m).sum() / jnp.maximum(denom, 1.0)
    if mode == "seq_sum_mean":  # LUSPO: each sequence's sum, averaged over sequences
        return (x * m).sum() / n_seq
    # constant
    if max_len is None or int(max_len) <= 0:
        raise ValueError(f"aggregate(mode='constant') needs max_len, a positive Python int; got {max_len!r}.")
    return (x * m).sum() / (n_seq * int(max_len))


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Per-position entropy H = −Σ_v p_v log p_v of softmax(logits), in float32 via log_softmax.

    logits: [..., V] -> [..., ]. Entries of −inf (masked vocabulary) contribute 0, not NaN.
    """
    logp = jax.nn.log_softmax(f32(logits), axis=-1)
    p = jnp.exp(logp)
    return -jnp.where(p > 0, p * logp, 0.0).sum(-1)
