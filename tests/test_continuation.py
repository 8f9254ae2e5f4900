"""Later turns continued from the KV cache (grpo_jax.policies.continuation): the reply sampled after a
feedback turn appended to the first turn's cache has the log-probs that the trainer's forward pass gives the
packed sequence (prompt | reply 1 | feedback | reply 2, no gaps), row by row, and the same tokens and
log-probs as the conversation encoded from scratch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.policies import continuation as cont
from grpo_jax.policies import sampling
from grpo_jax.policies import transformer as tfm

CFG = tfm.TransformerConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
EOS, PAD, T, F = 3, 0, 6, 5


def _setup(dtype="float32"):
    params = tfm.init_params(CFG, jax.random.key(0))
    prompt = jnp.asarray([[0, 0, 7, 8, 9, 10], [0, 11, 12, 13, 14, 15]], jnp.int32)
    pmask = (prompt > 0).astype(jnp.int32)
    sp = sampling.sampling_params(1.0)
    first = sampling.make_sampler(
        CFG, group=2, max_new=T, eos_id=EOS, pad_id=PAD, with_cache=True, weights_dtype=dtype
    )
    out, cache = first(params, prompt, pmask, jax.random.key(1), sp)
    fb = jnp.asarray(
        [[20, 21, 22, 23, 24], [25, 26, 0, 0, 0], [27, 28, 29, 0, 0], [30, 0, 0, 0, 0]], jnp.int32
    )
    fmask = (fb > 0).astype(jnp.int32)
    return params, prompt, pmask, out, cache, fb, fmask, sp


def _packed_logp(params, prompt, pmask, out, fb, fmask, out2):
    """Per row: the trainer's log-probs (forward over the packed sequence, left-padded) of reply 2's
    tokens."""
    rows = []
    for r in range(4):
        b, g = divmod(r, 2)
        seq = [int(t) for t, m in zip(prompt[b], pmask[b], strict=True) if m]
        seq += [int(t) for t, m in zip(out.tokens[b, g], out.mask[b, g], strict=True) if m]
        seq += [int(t) for t, m in zip(fb[r], fmask[r], strict=True) if m]
        start = len(seq)
        n2 = int(out2.mask[r, 0].sum())
        seq += [int(t) for t in out2.tokens[r, 0, :n2]]
        rows.append((seq, start, n2))
    width = max(len(s) for s, _, _ in rows)
    toks = np.zeros((4, width), np.int32)
    mask = np.zeros((4, width), np.int32)
    for i, (s, _, _) in enumerate(rows):
        toks[i, width - len(s) :], mask[i, width - len(s) :] = s, 1
    logits, _ = tfm.forward(params, CFG, jnp.asarray(toks), jnp.asarray(mask))
    lsm = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    got = []
    for i, (s, start, n2) in enumerate(rows):
        off = width - len(s)
        got.append([lsm[i, off + start + j - 1, s[start + j]] for j in range(n2)])
    return got


# bfloat16 rollouts (--rollout_dtype): the weights are bf16 (the cache float32), the trainer float32;
# measured max |difference| 8.9e-4 on this model (float32: 2.4e-7)
@pytest.mark.parametrize("dtype, atol", [("float32", 2e-5), ("bfloat16", 3e-3)])
def test_continued_reply_has_the_packed_sequences_log_probs(dtype, atol):
    params, prompt, pmask, out, cache, fb, fmask, sp = _setup(dtype)
    rc = cont.rows_from_cache(cache, out.mask, jnp.arange(4))
    c = cont.make_continuer(CFG, max_new=T, eos_id=EOS, pad_id=PAD, weights_dtype=dtype)
    out2, rc2 = c.extend_decode(params, rc, fb, fmask, jax.random.key(2), sp)
    assert out2.tokens.shape == (4, 1, T) and int(out2.mask.sum()) > 4
    want = _packed_logp(params, prompt, pmask, out, fb, fmask, out2)
    for r in range(4):
        n2 = int(out2.mask[r, 0].sum())
        np.testing.assert_allclose(np.asarray(out2.logp[r, 0, :n2]), want[r], atol=atol)
    # the cache grew by F + T slots; its real tokens are the prompt's, both replies' and the feedback's
    n_real = pmask.sum(1).repeat(2) + out.mask.reshape(4, -1).sum(1) + fmask.sum(1) + out2.mask[:, 0].sum(1)
    np.testing.assert_array_equal(np.asarray(rc2.npos), np.asarray(n_real))
    np.testing.assert_array_equal(np.asarray(rc2.valid.sum(1)), np.asarray(n_real))
    assert rc2.k[0].shape[2] == prompt.shape[1] + T + F + T


def test_continuing_equals_encoding_the_conversation_again():
    """Greedy: the continued reply and the one sampled after prefilling the packed context are the same tokens
    with log-probs equal up to rounding; `take` keeps rows independent (row 2 alone = row 2 of all)."""
    params, prompt, pmask, out, cache, fb, fmask, _ = _setup()
    greedy = sampling.sampling_params(0.0)
    c = cont.make_continuer(CFG, max_new=T, eos_id=EOS, pad_id=PAD)
    rc = cont.rows_from_cache(cache, out.mask, jnp.arange(4))
    a, _ = c.extend_decode(params, rc, fb, fmask, jax.random.key(3), greedy)
    width = prompt.shape[1] + T + F
    ctx = np.zeros((4, width), np.int32)
    cm = np.zeros((4, width), np.int32)
    for r in range(4):
        b, g = divmod(r, 2)
        seq = np.r_[prompt[b][pmask[b] > 0], out.tokens[b, g][out.mask[b, g] > 0], fb[r][fmask[r] > 0]]
        ctx[r, width - seq.size :], cm[r, width - seq.size :] = seq, 1
    b_, _ = c.from_tokens(params, jnp.asarray(ctx), jnp.asarray(cm), jax.random.key(3), greedy)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b_.tokens))
    np.testing.assert_allclose(np.asarray(a.logp), np.asarray(b_.logp), atol=2e-5)
    one, _ = c.extend_decode(
        params, cont.take(rc, jnp.asarray([2])), fb[2:3], fmask[2:3], jax.random.key(3), greedy
    )
    np.testing.assert_array_equal(np.asarray(one.tokens[0]), np.asarray(a.tokens[2]))
