"""Rollouts sampled in bfloat16 (`--rollout_dtype=bfloat16`, grpo_jax.policies.sampling.rollout_weights): the
policy's float32 weights are cast once per rollout (projections and head stored as rows [out, in]), the
matmuls run in bf16 (accumulated in float32, `transformer.matmul`; the KV cache and attention stay
float32), and the behaviour log-probs stay within bf16 rounding of the float32 trainer's. float32 (the
default) hands the sampler the policy itself.

Tolerances were measured on CPU on this tiny model (vocab 64, d_model 32, 2 layers, init_std 0.2 so that the
logits are not all ~0); each bound has a >= 2x margin over the measured value quoted next to it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.policies import sampling
from grpo_jax.policies import transformer as tfm

CFG = tfm.TransformerConfig(
    vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True, init_std=0.2
)
G, T = 3, 6


def _inputs():
    prompt = jnp.asarray([[0, 0, 7, 8, 9], [10, 11, 12, 13, 14]], jnp.int32)
    return prompt, (prompt > 0).astype(jnp.int32)


def test_matmul_rounds_a_float32_product_once():
    a = jnp.asarray([[1.0, 2.0**-8, 2.0**-8]], jnp.bfloat16)
    b = jnp.ones((3, 1), jnp.bfloat16)
    got = tfm.matmul(a, b, jnp.bfloat16)
    assert got.dtype == jnp.bfloat16
    # 1 + 2^-7 is a bf16 number; a bf16 running sum would stop at 1 (1 + 2^-8 rounds to even, twice)
    assert float(got[0, 0]) == 1.0078125
    x = jnp.asarray([[1.0, 2.0**-21, 2.0**-21]], jnp.float32)
    y = tfm.matmul(x, jnp.ones((3, 1), jnp.float32), jnp.float32)
    assert y.dtype == jnp.float32 and float(y[0, 0]) == 1.0 + 2.0**-20


def test_float32_rollout_is_the_policy_itself():
    params = tfm.init_params(CFG, jax.random.key(0))
    got, cfg = sampling.rollout_weights(params, CFG, "float32")
    assert got is params and cfg is CFG


def test_bfloat16_rollout_casts_every_weight_once_and_unties_the_head():
    params = tfm.init_params(CFG, jax.random.key(0))
    got, cfg = sampling.rollout_weights(params, CFG, "bfloat16")
    assert (cfg.compute_dtype, cfg.param_dtype, cfg.tie_embeddings) == ("bfloat16", "bfloat16", False)
    assert (
        dataclasses.replace(cfg, compute_dtype="float32", param_dtype="float32", tie_embeddings=True) == CFG
    )
    # every weight but the embedding table (looked up by rows, cast after the lookup) is bf16
    assert got["embed"] is params["embed"]
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree.leaves({**got, "embed": None}))
    # the head as rows [V, D]: a tied head is the cast table itself
    np.testing.assert_array_equal(
        np.asarray(got["lm_head_t"], np.float32), np.asarray(params["embed"].astype(jnp.bfloat16), np.float32)
    )
    assert set(got) == set(params) | {"lm_head_t"}
    # the layers come split (a list of per-layer casts: the sampler reads them in place), each the cast of
    # its slice of the stacked float32 weights, every projection kernel [in, out] stored as rows [out, in]
    assert isinstance(got["layers"], list) and len(got["layers"]) == CFG.n_layers
    for i, lp in enumerate(got["layers"]):
        want = jax.tree.map(lambda a, i=i: a[i].astype(jnp.bfloat16), params["layers"])
        want = {
            k: {("kernel_t" if n == "kernel" else n): (a.T if n == "kernel" else a) for n, a in v.items()}
            if isinstance(v, dict)
            else v
            for k, v in want.items()
        }
        assert all("kernel_t" in v for v in want.values() if isinstance(v, dict))  # the projections exist
        assert jax.tree.structure(lp) == jax.tree.structure(want)
        for w, x in zip(jax.tree.leaves(lp), jax.tree.leaves(want), strict=True):
            assert w.dtype == jnp.bfloat16
            np.testing.assert_array_equal(np.asarray(w, np.float32), np.asarray(x, np.float32))
    # the prefill over split weights is the prefill over the same weights stacked (the scan path)
    stacked = {**got, "layers": jax.tree.map(lambda *a: jnp.stack(a), *got["layers"])}
    prompt, pmask = _inputs()
    for a, b in zip(
        jax.tree.leaves(tfm.prefill(got, cfg, prompt, pmask, G, T)),
        jax.tree.leaves(tfm.prefill(stacked, cfg, prompt, pmask, G, T, layers=got["layers"])),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    untied = dataclasses.replace(CFG, tie_embeddings=False)
    p2 = tfm.init_params(untied, jax.random.key(0))
    got2, _ = sampling.rollout_weights(p2, untied, "bfloat16")
    assert set(got2) == set(p2) - {"lm_head"} | {"lm_head_t"} and got2["embed"] is p2["embed"]
    np.testing.assert_array_equal(
        np.asarray(got2["lm_head_t"], np.float32),
        np.asarray(p2["lm_head"].T.astype(jnp.bfloat16), np.float32),
    )
    with pytest.raises(ValueError, match="rollout dtype 'float16': valid: float32, bfloat16"):
        sampling.rollout_weights(params, CFG, "float16")


def test_rows_layout_samples_what_the_in_out_layout_samples():
    """The bf16 copy's projections and head stored as rows [out, in] (`tfm.rows_matmul`) give the same
    tokens and log-probs, bit for bit, as the same bf16 weights in the [in, out] layout (`tfm.matmul`)."""
    params = tfm.init_params(CFG, jax.random.key(0))
    rows, cfg = sampling.rollout_weights(params, CFG, "bfloat16")
    cols = {k: v for k, v in rows.items() if k != "lm_head_t"}
    cols["lm_head"] = rows["lm_head_t"].T
    cols["layers"] = [
        {
            k: {("kernel" if n == "kernel_t" else n): (a.T if n == "kernel_t" else a) for n, a in v.items()}
            if isinstance(v, dict)
            else v
            for k, v in lp.items()
        }
        for lp in rows["layers"]
    ]
    prompt, pmask = _inputs()
    sp = sampling.sampling_params(1.0)
    run = jax.jit(
        lambda prm: sampling.sample(
            prm, cfg, prompt, pmask, jax.random.key(5), sp, group=G, max_new=T, eos_id=1, pad_id=0
        )
    )
    a, b = run(rows), run(cols)
    assert int(a.mask.sum()) > 2 * G
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _trainer_logp(params, cfg, prompt, pmask, out):
    logits, _ = tfm.forward_grouped(params, cfg, prompt, pmask, out.tokens)
    return tfm.token_logp(logits, out.tokens)[0]


# grouped-query attention (2 query heads per key head) and plain multi-head (g = 1: the decode step's
# attention drops the group axis, transformer._attend_one)
@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bfloat16_sampler_log_probs_are_the_float32_trainers_to_bf16_rounding(temperature, kv_heads):
    cfg = dataclasses.replace(CFG, n_kv_heads=kv_heads)
    params = tfm.init_params(cfg, jax.random.key(0))
    prompt, pmask = _inputs()
    sp = sampling.sampling_params(temperature)
    gaps = {}
    for dtype in ("float32", "bfloat16"):
        fn = sampling.make_sampler(cfg, group=G, max_new=T, eos_id=1, pad_id=0, weights_dtype=dtype)
        out = fn(params, prompt, pmask, jax.random.key(3), sp)
        assert out.logp.dtype == jnp.float32 and int(out.mask.sum()) > 2 * G
        m = out.mask > 0
        lp = _trainer_logp(params, cfg, prompt, pmask, out)
        if temperature > 0 or dtype == "bfloat16":  # greedy logp is at temperature 1, as the trainer's here
            gaps[dtype] = float(jnp.max(jnp.where(m, jnp.abs(lp - out.logp), 0.0)))
    # measured: float32 1.2e-6; bfloat16 2.2e-2 .. 3.4e-2 (greedy and sampled, gqa and mha): the bf16 path
    if "float32" in gaps:
        assert gaps["float32"] < 1e-5
    assert 1e-3 < gaps["bfloat16"] < 0.08


@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("t", [2, 11])
def test_one_token_attention_equals_the_batched_dots(g, t):
    """transformer._attend_one (the bf16 sampler's attention as multiply-and-reduce, the group axis dropped
    when g = 1; its completion keys [B,G,K,Dh,T], transformer.keys_positions_last) against the float32
    sampler's einsums, with the completion cache filled up to t."""
    b, n, k, p, tc, d = 2, 3, 2, 5, 16, 8
    ks = jax.random.split(jax.random.key(g * 100 + t), 5)
    q = jax.random.normal(ks[0], (b, n, k, g, d))
    pk, pv = jax.random.normal(ks[1], (b, k, p, d)), jax.random.normal(ks[2], (b, k, p, d))
    ck, cv = jax.random.normal(ks[3], (b, n, k, tc, d)), jax.random.normal(ks[4], (b, n, k, tc, d))
    pmask = jnp.asarray([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], bool)[:, None, None, None, None, :]
    cmask = (jnp.arange(tc) <= t)[None, None, None, None, None, :]
    got = tfm._attend_one(q, pk, pv, jnp.swapaxes(ck, -1, -2), cv, pmask, cmask, 0.3)
    q6 = q[:, :, None]  # the float32 path's layout [B,G,1,K,g,Dh]
    s1 = jnp.einsum("bhtkgd,bksd->bhkgts", q6, pk) * 0.3
    s2 = jnp.einsum("bhtkgd,bhksd->bhkgts", q6, ck) * 0.3
    w1, w2 = tfm._softmax_attend([s1, s2], [pmask, cmask])
    want = jnp.einsum("bhkgts,bksd->bhtkgd", w1, pv) + jnp.einsum("bhkgts,bhksd->bhtkgd", w2, cv)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want[:, :, 0]), atol=1e-5)


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_a_bfloat16_policy_samples_the_same_from_its_bf16_copy(kv_heads):
    """Evaluation of a --compute_dtype=bfloat16 policy samples from the bf16 weight copy
    (policy_weights_dtype): the same tokens and log-probs as the float32 weights computing in bf16."""
    assert [
        sampling.policy_weights_dtype(dataclasses.replace(CFG, compute_dtype=d))
        for d in ("float32", "bfloat16", "float16")
    ] == ["float32", "bfloat16", "float32"]
    cfg = dataclasses.replace(CFG, n_kv_heads=kv_heads, compute_dtype="bfloat16")
    params = tfm.init_params(cfg, jax.random.key(0))
    prompt, pmask = _inputs()
    for temperature in (0.0, 1.0):
        outs = [
            sampling.make_sampler(cfg, group=G, max_new=T, eos_id=1, pad_id=0, weights_dtype=wd)(
                params, prompt, pmask, jax.random.key(3), sampling.sampling_params(temperature)
            )
            for wd in ("float32", sampling.policy_weights_dtype(cfg))
        ]
        assert int(outs[0].mask.sum()) > 2 * G
        for a, b in zip(outs[0], outs[1], strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
