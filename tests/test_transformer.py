"""Transformer LM and KV-cache sampler: every fast path equals the plain full forward."""

import dataclasses

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


# ----------------------------------------------------------------------------------------------------------
# architecture options of real checkpoints (grpo_jax.pretrained.hf): q/k norm (Qwen3), o_proj bias (Llama
# attention_bias), llama3 RoPE scaling, head_dim != d_model / n_heads. Every fast path must carry them.

EXT = tfm.TransformerConfig(
    vocab_size=32,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,
    head_dim=12,
    qkv_bias=True,
    o_bias=True,
    qk_norm=True,
    rope_scaling=tfm.RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
    ),
    tie_embeddings=False,
)


def _perturbed(cfg, key):
    """init_params with every leaf moved (norm weights != 1, biases != 0): options that do nothing at init
    would otherwise pass any test."""
    params = tfm.init_params(cfg, key)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
    moved = [x + 0.2 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(tree, moved)


@pytest.fixture(scope="module")
def ext_setup():
    params = _perturbed(EXT, jax.random.PRNGKey(0))
    prompt, pmask = _prompts(jax.random.PRNGKey(1))
    comps = jax.random.randint(jax.random.PRNGKey(2), (B, G, T), 2, EXT.vocab_size)
    return params, prompt, pmask, comps


def test_ext_init_and_num_params():
    params = tfm.init_params(EXT, jax.random.PRNGKey(0))
    lay = params["layers"]
    assert lay["q_norm"].shape == lay["k_norm"].shape == (2, 12)
    np.testing.assert_array_equal(lay["q_norm"], 1.0)
    assert lay["o_proj"]["bias"].shape == (2, 32) and lay["q_proj"]["kernel"].shape == (2, 32, 48)
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    assert n == EXT.num_params()
    # the default config draws the same random numbers as before these options existed: same keys, same leaves
    assert "q_norm" not in tfm.init_params(CFG, jax.random.PRNGKey(0))["layers"]


def test_ext_every_path_agrees(ext_setup):
    params, prompt, pmask, comps = ext_setup
    toks, mask = _full_sequences(prompt, pmask, comps)
    full = jax.jit(lambda p: tfm.forward(p, EXT, toks, mask)[0])(params)
    ref = full.reshape(B, G, P + T, -1)[:, :, P - 1 : P - 1 + T]
    grouped, _ = jax.jit(lambda p: tfm.forward_grouped(p, EXT, prompt, pmask, comps))(params)
    np.testing.assert_allclose(grouped, ref, atol=2e-5, rtol=1e-5)
    cache, lg = jax.jit(tfm.prefill, static_argnums=(1, 4, 5))(params, EXT, prompt, pmask, G, T)
    steps = [jnp.broadcast_to(lg[:, None], (B, G, EXT.vocab_size))]
    decode = jax.jit(tfm.decode_step, static_argnums=1)
    for t in range(T - 1):
        cache, lg = decode(params, EXT, cache, comps[:, :, t], jnp.int32(t))
        steps.append(lg)
    np.testing.assert_allclose(jnp.stack(steps, 2), grouped, atol=2e-5, rtol=1e-5)
    fwd = jax.jit(tfm.forward, static_argnums=1)
    l1, _ = fwd(params, EXT, prompt[:1], pmask[:1])  # left padding changes nothing
    l2, _ = fwd(params, EXT, prompt[:1, 2:], pmask[:1, 2:])
    np.testing.assert_allclose(l1[0, -1], l2[0, -1], atol=1e-5)
    sp = sampling.sampling_params(temperature=0.7)
    out = sampling.make_sampler(EXT, group=G, max_new=T, eos_id=1, pad_id=0)(
        params, prompt, pmask, jax.random.PRNGKey(3), sp
    )
    lgs, _ = jax.jit(tfm.forward_grouped, static_argnums=1)(params, EXT, prompt, pmask, out.tokens)
    logp, _ = tfm.token_logp(lgs, out.tokens, 0.7)
    np.testing.assert_allclose(out.logp * out.mask, logp * out.mask, atol=2e-5)
    # each option changes the function (so the agreement above is not vacuous)
    for off in (dict(qk_norm=False), dict(rope_scaling=None)):
        other = fwd(params, dataclasses.replace(EXT, **off), toks, mask)[0]
        assert float(jnp.abs(other - full).max()) > 1e-3, off
    no_bias = dict(params["layers"], o_proj={"kernel": params["layers"]["o_proj"]["kernel"]})
    other = fwd({**params, "layers": no_bias}, dataclasses.replace(EXT, o_bias=False), toks, mask)[0]
    assert float(jnp.abs(other - full).max()) > 1e-3


def test_ext_lora_targets_and_merge(ext_setup):
    from grpo_jax.policies import lora

    params, prompt, pmask, _ = ext_setup
    ad = lora.init(params, jax.random.PRNGKey(4), rank=2)  # B = 0: the merged model is the base model
    a, _ = tfm.forward(lora.merge(params, ad), EXT, prompt, pmask)
    b, _ = tfm.forward(params, EXT, prompt, pmask)
    np.testing.assert_allclose(a, b, atol=1e-6)


def _llama3_reference(dh, theta, factor, low, high, old):
    """Meta's Llama 3.1 `apply_scaling` (llama/model.py), float64, written independently of rope_inv_freq."""
    out = []
    for i in range(0, dh, 2):
        f = 1.0 / theta ** (i / dh)
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            s = (old / wavelen - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return np.array(out)


def test_rope_llama3_frequencies_and_default_unchanged():
    sc = tfm.RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
    )
    got = np.asarray(tfm.rope_inv_freq(16, 10000.0, sc))
    want = _llama3_reference(16, 10000.0, 8.0, 1.0, 4.0, 64)
    np.testing.assert_allclose(got, want, rtol=2e-6)
    plain = np.asarray(tfm.rope_inv_freq(16, 10000.0))
    wavelen = 2 * np.pi / plain
    assert (wavelen < 16).any() and ((wavelen >= 16) & (wavelen <= 64)).any() and (wavelen > 64).any()
    np.testing.assert_array_equal(got[wavelen < 16], plain[wavelen < 16])  # high frequencies untouched
    np.testing.assert_allclose(got[wavelen > 64], plain[wavelen > 64] / 8, rtol=1e-6)
    # the default path is bit-identical to the formula before rope scaling existed
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 7, 3, 16))
    pos = jnp.arange(7)[None].repeat(2, 0) * 3
    inv = 1.0 / (10000.0 ** (jnp.arange(0, 16, 2, dtype=jnp.float32) / 16))
    ang = pos.astype(jnp.float32)[..., None] * inv
    cos, sin = jnp.cos(ang)[..., None, :], jnp.sin(ang)[..., None, :]
    old = jnp.concatenate([x[..., :8] * cos - x[..., 8:] * sin, x[..., 8:] * cos + x[..., :8] * sin], -1)
    np.testing.assert_array_equal(tfm.rope(x, pos, 10000.0), old)


def test_ext_config_validation():
    base = dict(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=8)
    with pytest.raises(ValueError, match=r"RopeScaling.high_freq_factor=1.0: must be > low_freq_factor"):
        tfm.RopeScaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=1.0, original_max_position_embeddings=8
        )
    with pytest.raises(ValueError, match=r"RopeScaling.rope_type='yarn'"):
        tfm.RopeScaling(8.0, 1.0, 4.0, 8, rope_type="yarn")
    with pytest.raises(ValueError, match=r"TransformerConfig.rope_scaling=\(8.0, 1.0\)"):
        tfm.TransformerConfig(**base, rope_scaling=(8.0, 1.0))
    with pytest.raises(ValueError, match=r"TransformerConfig.family='qwen3': qwen3 always has the per-head"):
        tfm.TransformerConfig(**base, family="qwen3")
    with pytest.raises(ValueError, match=r"TransformerConfig.family='qwen2'"):
        tfm.TransformerConfig(**base, family="qwen2")
    with pytest.raises(ValueError, match=r"TransformerConfig.family='mixtral': valid: None, llama"):
        tfm.TransformerConfig(**base, family="mixtral")
    with pytest.raises(ValueError, match=r"TransformerConfig.max_position_embeddings=0"):
        tfm.TransformerConfig(**base, max_position_embeddings=0)
    # rebuilt from dataclasses.asdict (JSON): the dict becomes the hashable RopeScaling again
    again = tfm.TransformerConfig(**dataclasses.asdict(EXT))
    assert again == EXT and hash(again) == hash(EXT)
