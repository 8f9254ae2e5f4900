"""SFT warm start: the loss is a token mean over completion tokens, it decreases, and it is deterministic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax.codegen import pipeline
from grpo_jax.codegen.tasks import make_split
from grpo_jax.policies import transformer as tfm
from grpo_jax.tokenization.code import CodeTokenizer
from grpo_jax.train.sft import SFTBatch, bucket_widths, make_sft_step, sft_loss, sft_train

TOK = CodeTokenizer()
CFG = tfm.TransformerConfig(
    vocab_size=TOK.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64, qkv_bias=True
)
DATA = pipeline.sft_examples(TOK, make_split("train", levels=(0,), n_per_level=16, seed=0), 48, 12)


def _params(seed=0):
    return tfm.init_params(CFG, jax.random.PRNGKey(seed))


def test_loss_is_token_mean_cross_entropy_over_completion_tokens():
    params = _params()
    batch = SFTBatch(*(jnp.asarray(a[:4]) for a in DATA))
    loss_fn = jax.jit(sft_loss, static_argnums=1)
    loss, aux = loss_fn(params, CFG, batch)
    # reference: the plain forward on the concatenated sequences (prompt left-padded, completion after it)
    seq = jnp.concatenate([batch.prompt, batch.completion], axis=1)
    mask = jnp.concatenate([batch.prompt_mask, jnp.ones_like(batch.completion)], axis=1)
    logits, _ = jax.jit(tfm.forward, static_argnums=1)(params, CFG, seq, mask)
    p = batch.prompt.shape[1]
    lg = logits[:, p - 1 : -1]  # position s predicts token s + 1
    nll = -jnp.take_along_axis(jax.nn.log_softmax(lg), batch.completion[..., None], -1)[..., 0]
    m = batch.completion_mask.astype(jnp.float32)
    np.testing.assert_allclose(loss, jnp.sum(nll * m) / jnp.sum(m), rtol=1e-5)
    # tokens outside the completion mask do not change the loss
    junk = jnp.where(batch.completion_mask > 0, batch.completion, 77)
    loss2, _ = loss_fn(params, CFG, batch.replace(completion=junk))
    np.testing.assert_allclose(loss, loss2, rtol=1e-6)
    assert 0.0 <= float(aux["accuracy"]) <= 1.0


def test_sft_step_reduces_loss_and_compiles_once():
    opt = optax.adam(3e-3)
    step = make_sft_step(CFG, opt)
    params = _params()
    state = opt.init(params)
    batch = SFTBatch(*(jnp.asarray(a[:8]) for a in DATA))
    losses = []
    for _ in range(8):
        params, state, m = step(params, state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < losses[0] - 0.5, losses
    assert step._cache_size() == 1


def test_sft_train_learns_and_is_deterministic():
    opt = optax.adam(3e-3)
    kw = dict(steps=12, batch_size=8, key=jax.random.PRNGKey(3))
    p1, h1 = sft_train(_params(), CFG, opt, DATA, **kw, print_fn=lambda s: None)
    p2, h2 = sft_train(_params(), CFG, opt, DATA, **kw, print_fn=lambda s: None)
    assert len(h1) == 12 and h1[-1]["loss"] < h1[0]["loss"] - 0.5
    assert h1 == h2
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    p3, _ = sft_train(
        _params(), CFG, opt, DATA, steps=12, batch_size=8, key=jax.random.PRNGKey(4), print_fn=lambda s: None
    )
    pairs = zip(jax.tree.leaves(p1), jax.tree.leaves(p3), strict=True)
    assert any(not np.array_equal(a, b) for a, b in pairs)


def test_bucket_widths_cut_only_padding():
    pmask = np.array([[0, 0, 0, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 0, 1]])  # left-padded prompts: 2, 4, 1
    cmask = np.array([[1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]])  # targets: 3, 1, 2
    assert bucket_widths(pmask, cmask, np.array([0, 2]), 1) == (2, 3)
    assert bucket_widths(pmask, cmask, np.array([0, 2]), 2) == (2, 4)
    assert bucket_widths(pmask, cmask, np.array([1]), 4) == (4, 4)
    assert bucket_widths(pmask, cmask, np.array([0, 1, 2]), 8) == (5, 6)  # at most the full widths


def test_bucketed_sft_is_the_padded_sft_to_float_rounding():
    """The same minibatches, cut to their real lengths (multiples of 4): the same losses and parameters to
    float rounding, on narrower rows than prompt_len + max_new_tokens."""
    opt = optax.adam(3e-3)
    kw = dict(steps=6, batch_size=8, key=jax.random.PRNGKey(3), print_fn=lambda s: None)
    padded, hp = sft_train(_params(), CFG, opt, DATA, **kw)
    cut, hc = sft_train(_params(), CFG, opt, DATA, **kw, bucket=4)
    np.testing.assert_allclose([h["loss"] for h in hc], [h["loss"] for h in hp], rtol=1e-5)
    assert [h["tokens"] for h in hc] == [h["tokens"] for h in hp]
    for a, b in zip(jax.tree.leaves(cut), jax.tree.leaves(padded), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
    pw, cw = bucket_widths(np.asarray(DATA[1]), np.asarray(DATA[3]), np.arange(len(DATA[0])), 4)
    assert pw < DATA[0].shape[1]  # the cut is real here: the prompts' padding is wider than any prompt
