"""Transformer LM and KV-cache sampler: every fast path equals the plain full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.policies import sampling
from grpo_jax.policies import transformer as tfm

CFG = tfm.TransformerConfig(
    vocab_size=32,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,
    qkv_bias=True,
    tie_embeddings=False,
)
B, G, P, T = 2, 3, 5, 4


def _prompts(key):
    tok = jax.random.randint(key, (B, P), 2, CFG.vocab_size)
    mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], jnp.int32)  # left padding in row 0
    return jnp.where(mask > 0, tok, 0), mask


def _full_sequences(prompt, pmask, comps):
    """[B,G,P+T] tokens and mask: the prompt repeated per sample, then the completion."""
    pr = jnp.broadcast_to(prompt[:, None], (B, G, P))
    pm = jnp.broadcast_to(pmask[:, None], (B, G, P))
    toks = jnp.concatenate([pr, comps], -1).reshape(B * G, P + T)
    mask = jnp.concatenate([pm, jnp.ones_like(comps)], -1).reshape(B * G, P + T)
    return toks, mask


@pytest.fixture(scope="module")
def setup():
    params = tfm.init_params(CFG, jax.random.PRNGKey(0))
    prompt, pmask = _prompts(jax.random.PRNGKey(1))
    comps = jax.random.randint(jax.random.PRNGKey(2), (B, G, T), 2, CFG.vocab_size)
    return params, prompt, pmask, comps


def test_config_validation():
    with pytest.raises(ValueError, match="n_kv_heads"):
        tfm.TransformerConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=4, n_kv_heads=3, d_ff=8)
    with pytest.raises(ValueError, match="compute_dtype"):
        tfm.TransformerConfig(
            vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=8, compute_dtype="x"
        )


def test_num_params_matches_tree():
    for cfg in (CFG, tfm.TINY):
        params = jax.eval_shape(lambda cfg=cfg: tfm.init_params(cfg, jax.random.PRNGKey(0)))
        n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
        assert n == cfg.num_params()


def test_grouped_forward_equals_full_forward(setup):
    params, prompt, pmask, comps = setup
    logits_g, _ = jax.jit(lambda p: tfm.forward_grouped(p, CFG, prompt, pmask, comps))(params)
    toks, mask = _full_sequences(prompt, pmask, comps)
    logits_f, _ = jax.jit(lambda p: tfm.forward(p, CFG, toks, mask))(params)
    # completion token t is predicted by full-sequence position P - 1 + t
    ref = logits_f.reshape(B, G, P + T, -1)[:, :, P - 1 : P - 1 + T]
    np.testing.assert_allclose(logits_g, ref, atol=2e-5, rtol=1e-5)


def test_left_padding_does_not_change_logits(setup):
    params, prompt, pmask, _ = setup
    # row 0 has 2 pads; the same 3 real tokens without padding must give the same last logits
    l1, _ = tfm.forward(params, CFG, prompt[:1], pmask[:1])
    l2, _ = tfm.forward(params, CFG, prompt[:1, 2:], pmask[:1, 2:])
    np.testing.assert_allclose(l1[0, -1], l2[0, -1], atol=1e-5)


def test_cached_decode_equals_full_forward(setup):
    params, prompt, pmask, comps = setup
    cache, logits0 = tfm.prefill(params, CFG, prompt, pmask, G, T)
    step_logits = [jnp.broadcast_to(logits0[:, None], (B, G, CFG.vocab_size))]
    for t in range(T - 1):
        cache, lg = tfm.decode_step(params, CFG, cache, comps[:, :, t], jnp.int32(t))
        step_logits.append(lg)
    cached = jnp.stack(step_logits, axis=2)
    grouped, _ = tfm.forward_grouped(params, CFG, prompt, pmask, comps)
    np.testing.assert_allclose(cached, grouped, atol=2e-5, rtol=1e-5)


def test_value_head_and_tied_embeddings():
    cfg = tfm.TransformerConfig(
        vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, value_head=True
    )
    params = tfm.init_params(cfg, jax.random.PRNGKey(0))
    assert "lm_head" not in params
    toks = jnp.ones((2, 3), jnp.int32)
    logits, values = tfm.forward(params, cfg, toks, jnp.ones_like(toks))
    assert logits.shape == (2, 3, 16) and values.shape == (2, 3)


def _sampler(**kw):
    return sampling.make_sampler(CFG, group=G, max_new=T, eos_id=kw.get("eos", 1), pad_id=0)


def test_sampler_logp_matches_training_forward(setup):
    params, prompt, pmask, _ = setup
    sp = sampling.sampling_params(temperature=0.7)
    out = _sampler()(params, prompt, pmask, jax.random.PRNGKey(3), sp)
    assert out.tokens.shape == (B, G, T) and out.logp.shape == (B, G, T)
    logits, _ = tfm.forward_grouped(params, CFG, prompt, pmask, out.tokens)
    logp, _ = tfm.token_logp(logits, out.tokens, 0.7)
    np.testing.assert_allclose(out.logp * out.mask, logp * out.mask, atol=2e-5)


def test_sampler_same_key_same_samples_and_no_recompile(setup):
    params, prompt, pmask, _ = setup
    fn = _sampler()
    sp = sampling.sampling_params(temperature=1.0)
    a = fn(params, prompt, pmask, jax.random.PRNGKey(7), sp)
    n_compiles = fn._cache_size()
    b = fn(params, prompt, pmask, jax.random.PRNGKey(7), sp)
    c = fn(
        params,
        prompt,
        pmask,
        jax.random.PRNGKey(8),
        sampling.sampling_params(temperature=0.5, top_k=5, top_p=0.9),
    )
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logp, b.logp)
    assert fn._cache_size() == n_compiles == 1  # new key and new sampling params: no recompilation
    assert not np.array_equal(a.tokens, c.tokens)


def test_eos_masks_and_lengths(setup):
    params, prompt, pmask, _ = setup
    # a zero final norm makes every logit 0: greedy then picks token 0, which we declare to be EOS
    p2 = dict(params, final_norm=jnp.zeros_like(params["final_norm"]))
    fn = sampling.make_sampler(CFG, group=G, max_new=T, eos_id=0, pad_id=0)
    out = fn(p2, prompt, pmask, jax.random.PRNGKey(0), sampling.sampling_params(temperature=0.0))
    np.testing.assert_array_equal(out.lengths, np.ones((B, G)))
    np.testing.assert_array_equal(out.mask[..., 0], np.ones((B, G)))
    np.testing.assert_array_equal(out.mask[..., 1:], np.zeros((B, G, T - 1)))
    assert not out.truncated.any()
    # no EOS ever (eos_id outside the vocab): full length, truncated
    out = _sampler(eos=-1)(params, prompt, pmask, jax.random.PRNGKey(0), sampling.sampling_params())
    np.testing.assert_array_equal(out.lengths, np.full((B, G), T))
    assert out.truncated.all()


def test_greedy_is_argmax_and_filters(setup):
    params, prompt, pmask, _ = setup
    out = _sampler(eos=-1)(
        params, prompt, pmask, jax.random.PRNGKey(0), sampling.sampling_params(temperature=0.0)
    )
    logits, _ = tfm.forward_grouped(params, CFG, prompt, pmask, out.tokens)
    np.testing.assert_array_equal(out.tokens, jnp.argmax(logits, -1))
    lg = jnp.array([[3.0, 2.0, 1.0, 0.0]])
    f = sampling.filter_logits(lg, jnp.int32(2), jnp.float32(1.0))
    np.testing.assert_array_equal(np.isfinite(f), [[True, True, False, False]])
    # softmax([3,2,1,0]) = [0.644, 0.237, 0.087, 0.032]: top_p=0.7 keeps the first two
    f = sampling.filter_logits(lg, jnp.int32(0), jnp.float32(0.7))
    np.testing.assert_array_equal(np.isfinite(f), [[True, True, False, False]])
    f = sampling.filter_logits(lg, jnp.int32(0), jnp.float32(0.5))
    np.testing.assert_array_equal(np.isfinite(f), [[True, False, False, False]])


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="top_p"):
        sampling.sampling_params(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        sampling.sampling_params(temperature=-1.0)
