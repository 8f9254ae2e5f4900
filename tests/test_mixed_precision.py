"""Mixed precision (docs/GRPO_MATH.md §3 row 19): float32 master weights, bf16 matmuls, float32 logits and
losses.

With TransformerConfig(compute_dtype="bfloat16") the parameters stay float32 (in the TrainState and in the
optimiser), they are cast to bf16 at each matmul, and the LM head returns float32 logits (accumulated in
float32, not a rounded bf16 result), so log-softmax, token log-probs, ratios and the KL are float32.

Tolerances below were measured on CPU on this tiny model (vocab 64, d_model 32, 2 layers): the worst case
over 8 init seeds for the forward / gradient checks, over 4 for the sampler, and the one run of the train-step
check; each bound has a >= 2x margin over the measured value quoted next to it.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ObjectiveConfig, OptimConfig
from grpo_jax.envs import token_task as tt
from grpo_jax.policies import sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.state import init_state, make_optimizer
from grpo_jax.train.step import make_train_step
from grpo_jax.types import batch_from_samples

F32 = tfm.TransformerConfig(
    vocab_size=64,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,
    qkv_bias=True,
    tie_embeddings=False,
)
BF16 = dataclasses.replace(F32, compute_dtype="bfloat16")
B, G, P, T = 2, 3, 5, 4


def _inputs(seed=0):
    k = jax.random.split(jax.random.PRNGKey(100 + seed), 3)
    prompt = jax.random.randint(k[0], (B, P), 2, F32.vocab_size)
    pmask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], jnp.int32)  # left padding in row 0
    comps = jax.random.randint(k[1], (B, G, T), 2, F32.vocab_size)
    adv = jax.random.normal(k[2], (B, G))
    return jnp.where(pmask > 0, prompt, 0), pmask, comps, adv


def _params(init_std=0.02, seed=0):
    return tfm.init_params(dataclasses.replace(F32, init_std=init_std), jax.random.PRNGKey(seed))


def _pg_loss(params, cfg, prompt, pmask, comps, adv):
    """A policy-gradient-shaped scalar: −mean(logp · A) − 0.01 · mean(entropy)."""
    logits, _ = tfm.forward_grouped(params, cfg, prompt, pmask, comps)
    logp, ent = tfm.token_logp(logits, comps)
    return -jnp.mean(logp * adv[..., None]) - 0.01 * jnp.mean(ent)


# compiled once per config (init_std only affects init_params, so every test passes F32 / BF16 themselves)
_fwd = jax.jit(
    lambda p, cfg, prompt, pmask, comps: tfm.forward_grouped(p, cfg, prompt, pmask, comps)[0],
    static_argnums=1,
)
_grad = jax.jit(jax.grad(_pg_loss), static_argnums=1)


def _global_norm(tree):
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree))))


def test_logits_and_logp_are_float32_and_not_bf16_rounded():
    params = _params()
    prompt, pmask, comps, _ = _inputs()
    logits = _fwd(params, BF16, prompt, pmask, comps)
    assert logits.dtype == jnp.float32
    # the LM head accumulates in float32: the logits are not merely bf16 values cast up afterwards
    rounded = logits.astype(jnp.bfloat16).astype(jnp.float32)
    assert not bool(jnp.all(rounded == logits))
    logp, ent = tfm.token_logp(logits, comps)
    assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32
    full = jax.eval_shape(lambda p: tfm.forward(p, BF16, prompt, pmask)[0], params)
    assert full.dtype == jnp.float32
    # bf16 inputs never make token_logp compute in bf16
    lp16, _ = tfm.token_logp(logits.astype(jnp.bfloat16), comps)
    assert lp16.dtype == jnp.float32


@pytest.mark.parametrize(
    "init_std, logit_atol, logp_atol",
    [
        # default init (max |logit| ~0.5): measured max |Δlogit| 2.6e-3, max |Δlogp| 1.6e-3
        (0.02, 1e-2, 1e-2),
        # 10x init (max |logit| ~6): measured max |Δlogit| 0.105, max |Δlogp| 0.064
        (0.2, 0.3, 0.2),
    ],
)
def test_bf16_logits_close_to_float32(init_std, logit_atol, logp_atol):
    params = _params(init_std)
    prompt, pmask, comps, _ = _inputs()
    l32 = _fwd(params, F32, prompt, pmask, comps)
    l16 = _fwd(params, BF16, prompt, pmask, comps)
    assert float(jnp.max(jnp.abs(l16 - l32))) < logit_atol
    lp32, _ = tfm.token_logp(l32, comps)
    lp16, _ = tfm.token_logp(l16, comps)
    assert float(jnp.max(jnp.abs(lp16 - lp32))) < logp_atol


@pytest.mark.parametrize(
    "init_std, norm_rtol, vec_rtol",
    [
        # measured (8 seeds): |‖g16‖−‖g32‖|/‖g32‖ ≤ 8.5e-4, ‖g16−g32‖/‖g32‖ ≤ 5.1e-3
        (0.02, 5e-3, 2e-2),
        # measured (8 seeds): ≤ 6.9e-3 and ≤ 2.3e-2
        (0.2, 3e-2, 5e-2),
    ],
)
def test_gradients_are_float32_finite_and_close(init_std, norm_rtol, vec_rtol):
    params = _params(init_std)
    prompt, pmask, comps, adv = _inputs()
    g32 = _grad(params, F32, prompt, pmask, comps, adv)
    g16 = _grad(params, BF16, prompt, pmask, comps, adv)
    for leaf, p in zip(jax.tree.leaves(g16), jax.tree.leaves(params), strict=True):
        assert leaf.dtype == jnp.float32 and leaf.shape == p.shape
        assert bool(jnp.all(jnp.isfinite(leaf)))
    n32, n16 = _global_norm(g32), _global_norm(g16)
    assert n32 > 0
    assert abs(n16 - n32) / n32 < norm_rtol
    diff = _global_norm(jax.tree.map(lambda a, b: a - b, g16, g32))
    assert diff / n32 < vec_rtol


def test_sampler_bf16_returns_float32_logp_consistent_with_trainer():
    params = _params()
    prompt, pmask, _, _ = _inputs()
    sp = sampling.sampling_params(1.0)
    out16 = sampling.make_sampler(BF16, group=G, max_new=T, eos_id=1, pad_id=0)(
        params, prompt, pmask, jax.random.PRNGKey(7), sp
    )
    out32 = sampling.make_sampler(F32, group=G, max_new=T, eos_id=1, pad_id=0)(
        params, prompt, pmask, jax.random.PRNGKey(7), sp
    )
    assert out16.logp.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(out16.logp)))
    assert bool(jnp.all(out16.logp <= 0.0))
    # the trainer's bf16 log-probs of the sampled tokens (KV-cache decode vs grouped forward: different bf16
    # rounding paths). Measured max |Δ| ≤ 9.0e-4 over 4 seeds; the float32 sampler on the same tokens differs
    # by ≤ 1.8e-3.
    logits = _fwd(params, BF16, prompt, pmask, out16.tokens)
    lp_train, _ = tfm.token_logp(logits, out16.tokens)
    m = out16.mask > 0
    assert float(jnp.max(jnp.where(m, jnp.abs(lp_train - out16.logp), 0.0))) < 5e-3
    if bool(jnp.all(out16.tokens == out32.tokens)):
        assert float(jnp.max(jnp.where(m, jnp.abs(out32.logp - out16.logp), 0.0))) < 1e-2


def _train(cfg, batches):
    obj = ObjectiveConfig(kl_coef=0.04, entropy_coef=0.01)
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2))
    state = init_state(_params(), obj, optimizer, seed=0)
    step = make_train_step(cfg, obj, optimizer)
    metrics = []
    for batch in batches:
        state, m, _ = step(state, batch)
        metrics.append(jax.device_get(m))
    return jax.device_get(state), metrics


def test_train_step_bf16_keeps_float32_params_and_matches_float32_loss():
    params0 = _params()
    sampler = sampling.make_sampler(F32, group=G, max_new=T, eos_id=1, pad_id=0)
    batches = []
    for i in range(2):  # the same two float32-sampled batches feed both runs
        prompt, pmask = tt.make_prompts(jax.random.PRNGKey(i), B, P, F32.vocab_size)
        out = sampler(params0, prompt, pmask, jax.random.PRNGKey(100 + i), sampling.sampling_params(1.0))
        batches.append(batch_from_samples(prompt, pmask, out, tt.rewards(prompt, out.tokens, F32.vocab_size)))
    s32, m32 = _train(F32, batches)
    s16, m16 = _train(BF16, batches)
    for tree in (s16.params, s16.ref_params, s16.opt_state):
        for leaf in jax.tree.leaves(tree):
            if jnp.issubdtype(leaf.dtype, jnp.floating):
                assert leaf.dtype == jnp.float32
    new, old = jax.tree.leaves(s16.params), jax.tree.leaves(params0)
    assert all(bool(jnp.all(jnp.isfinite(a))) for a in new)
    assert any(not np.array_equal(a, b) for a, b in zip(new, old, strict=True))
    assert int(s16.step) == 2
    for m in m16:
        for k, v in m.items():
            assert np.all(np.isfinite(v)), k
    # measured |Δloss| 1.9e-8 (step 1: on-policy, KL 0) and 9.7e-8 (step 2: KL > 0); relative grad-norm
    # difference 9.2e-4 and 1.7e-3
    for a, b in zip(m32, m16, strict=True):
        assert abs(float(a["loss"]) - float(b["loss"])) < 1e-4
        assert abs(float(a["grad_norm"]) - float(b["grad_norm"])) / float(a["grad_norm"]) < 2e-2
    assert float(m16[1]["kl"]) > 0.0
    # step 1 is on-policy for the float32 sampler: the sampler-vs-trainer mismatch is then the precision gap
    # (float32 decode vs bf16 grouped forward; measured 2.7e-4), against 2e-8 for the float32 trainer.
    assert float(m32[0]["logp_mismatch"]) < 1e-5
    assert float(m16[0]["logp_mismatch"]) < 5e-3


def test_low_precision_matmul_gradients_are_the_products_of_the_rounded_operands():
    """tfm.matmul below float32 (a custom VJP): da = g·bᵀ rounded to a's dtype, db = aᵀ·g in float32 (the
    master weight's dtype); exact here (small integers, exactly representable in bf16)."""
    a = jnp.asarray([[1.0, 2.0], [3.0, 4.0]], jnp.bfloat16)
    b = jnp.asarray([[1.0, 0.0, 2.0], [0.0, 1.0, 1.0]], jnp.float32)
    g = jnp.asarray([[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]], jnp.float32)

    def f(a, b):
        return jnp.sum(tfm.matmul(a, b, jnp.bfloat16).astype(jnp.float32) * g)

    np.testing.assert_array_equal(
        np.asarray(tfm.matmul(a, b, jnp.bfloat16), np.float32), [[1, 2, 4], [3, 4, 10]]
    )
    da, db = jax.grad(f, argnums=(0, 1))(a, b)
    assert da.dtype == jnp.bfloat16 and db.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(da, np.float32), [[7.0, 5.0], [0.0, 1.0]])  # g · bᵀ
    np.testing.assert_array_equal(np.asarray(db), [[1.0, 5.0, 3.0], [2.0, 8.0, 6.0]])  # aᵀ · g


def test_bf16_dense_bias_gradient_is_the_float32_column_sum():
    """Below float32 a dense layer's bias is added in the compute dtype and its gradient is the column sum of
    the bf16 cotangent accumulated in float32 (tfm._add_bias_lowp), cast to the bias's own dtype."""
    x = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], jnp.bfloat16)
    p = {"kernel": jnp.eye(2, dtype=jnp.float32), "bias": jnp.asarray([0.5, -1.0], jnp.float32)}
    y = tfm.dense(x, p, jnp.bfloat16)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(y, np.float32), [[1.5, -1.0], [0.5, 0.0], [1.5, 0.0], [0.5, -1.0]]
    )
    # each column sums 1 + 3 * 2^-8 = 1.01171875 in float32, which bf16 cannot hold (its spacing at 1 is
    # 2^-7); a bf16 running sum would stay at 1 (1 + 2^-8 rounds to even, each time)
    e = 2.0**-8
    g = jnp.asarray([[1.0, e], [e, 1.0], [e, e], [e, e]], jnp.bfloat16)
    _, vjp = jax.vjp(lambda x, p: tfm.dense(x, p, jnp.bfloat16), x, p)
    dx, dp = vjp(g)
    assert dp["bias"].dtype == jnp.float32 and dx.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(dp["bias"]), [1.01171875, 1.01171875])
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(g, np.float32))  # kernel = I


def test_fused_softmax_backward_is_the_textbook_gradient_of_the_joint_softmax():
    """Below float32 the attention's joint softmax has its own backward (tfm._attend_weights):
    dS_i = W_i (dW_i - sum_j sum(W_j dW_j)) over both key blocks. Literal case: scores [0, ln 3] and [ln 4]
    with one masked key (W = [1/8, 3/8 | 1/2, 0]), cotangent [1, 0 | 0, 5]: c = 1/8, dS = [7/64, -3/64 |
    -1/16, 0]. It equals JAX's derivative of the float32 path (`_softmax_attend`) up to rounding, and its
    forward is that path's bit for bit."""
    s1 = jnp.asarray([[0.0, np.log(3.0)]], jnp.float32)
    s2 = jnp.asarray([[np.log(4.0), 7.0]], jnp.float32)
    masks = [jnp.asarray([[True, True]]), jnp.asarray([[True, False]])]
    ct = [jnp.asarray([[1.0, 0.0]]), jnp.asarray([[0.0, 5.0]])]

    def loss(fn):
        return lambda a, b: sum(jnp.sum(w * c) for w, c in zip(fn([a, b], masks), ct, strict=True))

    fused = loss(lambda sc, m: tfm._attend_weights(sc, m, jnp.bfloat16))
    w = tfm._attend_weights([s1, s2], masks, jnp.bfloat16)
    np.testing.assert_allclose(
        np.concatenate([np.asarray(x) for x in w], -1), [[1 / 8, 3 / 8, 1 / 2, 0]], rtol=1e-6
    )
    d1, d2 = jax.grad(fused, (0, 1))(s1, s2)
    np.testing.assert_allclose(np.asarray(d1), [[7 / 64, -3 / 64]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(d2), [[-1 / 16, 0.0]], atol=1e-7)
    r1, r2 = jax.grad(loss(tfm._softmax_attend), (0, 1))(s1, s2)
    np.testing.assert_allclose(np.asarray(d1), np.asarray(r1), atol=1e-7)
    np.testing.assert_allclose(np.asarray(d2), np.asarray(r2), atol=1e-7)
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    big = [jax.random.normal(k[0], (3, 4, 5)), jax.random.normal(k[1], (3, 4, 6))]
    bm = [jnp.ones((1, 1, 5), bool), jnp.tril(jnp.ones((4, 6), bool))[None]]
    for a, b in zip(tfm._attend_weights(big, bm, jnp.bfloat16), tfm._softmax_attend(big, bm), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fused_softmax_drops_the_size_one_axes_and_keeps_its_values():
    """Without grouped-query sharing the training forwards' scores carry a size-1 group axis; below float32
    `_attend_weights` drops every axis of size 1 in all blocks before its fused softmax (XLA:CPU's library
    fusions of the backward's multiply-and-reduce ran ~8x slower with it:
    docs/results/mixed_precision_and_memory.md), and gives the
    weights back in the scores' shapes. Weights and gradients are those of the fused softmax on the
    unsqueezed blocks, bit for bit; masks of lower rank broadcast as before."""
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    s1 = jax.random.normal(k[0], (2, 3, 1, 4, 5))  # [B, K, g=1, T, S1]
    s2 = jax.random.normal(k[1], (2, 3, 1, 4, 6))
    masks = [jnp.asarray([1, 1, 0, 1, 1], bool)[None, None, None, None], jnp.tril(jnp.ones((4, 6), bool), 1)]
    ct = [jax.random.normal(k[2], s1.shape), jax.random.normal(k[2], s2.shape)]

    def loss(fn):
        return lambda a, b: sum(jnp.sum(w * c) for w, c in zip(fn([a, b]), ct, strict=True))

    lowp = lambda sc: tfm._attend_weights(sc, masks, jnp.bfloat16)
    direct = lambda sc: list(tfm._softmax_attend_vjp(tuple(sc), (masks[0], masks[1][None, None, None])))
    for a, b in zip(lowp([s1, s2]), direct([s1, s2]), strict=True):
        assert a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(
        jax.grad(loss(lowp), (0, 1))(s1, s2), jax.grad(loss(direct), (0, 1))(s1, s2), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    jaxpr = jax.make_jaxpr(lambda a, b: lowp([a, b]))(s1, s2)
    (call,) = [e for e in jaxpr.eqns if e.primitive.name == "custom_vjp_call"]
    assert [v.aval.shape for v in call.invars] == [(2, 3, 4, 5), (2, 3, 4, 6), (1, 1, 1, 5), (1, 1, 4, 6)]


def test_bf16_swiglu_rounds_once():
    """Below float32 the MLP's SiLU(gate) * up is computed in float32 from the bf16 projections and rounded
    once (tfm.swiglu; XLA:CPU's bf16 chain rounds after each op and ran ~2x slower). gate -4, up -5:
    -5 * -4 * sigmoid(-4) = 0.3597242 -> bf16 0.359375 (rounding after each op gave 0.361328125);
    float32 is the plain product."""
    g = jnp.asarray([-4.0, -4.5], jnp.bfloat16)
    u = jnp.asarray([-5.0, -5.0], jnp.bfloat16)
    y = tfm.swiglu(g, u)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32), [0.359375, 0.2470703125])
    y32 = tfm.swiglu(g.astype(jnp.float32), u.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(y32), [0.35972419, 0.24720621], rtol=1e-6)


def test_bf16_rope_is_the_rotation_in_float32_rounded_once_without_a_concatenation():
    """Below float32 RoPE's rotated half is a product with a signed permutation (tfm.apply_rope; XLA:CPU
    fused the slices-and-concatenation form with the head transpose into a ~2x slower loop). Literal case,
    Dh = 4: x = [1, 2 | 3, 4], cos = [0.6, 0], sin = [0.8, 1]: [1*0.6 - 3*0.8, 2*0 - 4*1 | 3*0.6 + 1*0.8,
    4*0 + 2*1] = [-1.8, -4, 2.6, 2], rounded once to bf16: [-1.796875, -4, 2.59375, 2]. On random values it
    is the float32 formula rounded to bf16 (within one bf16 ulp: float32 rounding of the two forms may
    differ); float32 keeps the slices. The product has a batch axis of size 1, so the remat policy
    `dots_no_batch` recomputes it instead of keeping its float32 output (+124 MB of SmolLM2's train-step
    temporaries when it was kept)."""
    x = jnp.asarray([[[1.0, 2.0, 3.0, 4.0]]], jnp.bfloat16)  # [S=1, heads=1, Dh=4]
    tables = tfm.RopeTables(jnp.asarray([[[0.6, 0.0]]]), jnp.asarray([[[0.8, 1.0]]]))
    y = tfm.apply_rope(x, tables)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32), [[[-1.796875, -4.0, 2.59375, 2.0]]])
    xs = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 3, 16))
    tab = tfm.rope_tables(jnp.arange(5)[None].repeat(2, 0) * 7, 16, 10000.0)
    want = tfm.apply_rope(xs.astype(jnp.bfloat16).astype(jnp.float32), tab).astype(jnp.bfloat16)
    got = tfm.apply_rope(xs.astype(jnp.bfloat16), tab)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2**-7, atol=0)
    eqns = jax.make_jaxpr(tfm.apply_rope)(xs.astype(jnp.bfloat16), tab).eqns
    (dot,) = [e for e in eqns if e.primitive.name == "dot_general"]
    assert dot.params["dimension_numbers"][1] != ((), ())  # a batch axis: `dots_no_batch` does not keep it
    assert {e.primitive.name for e in jax.make_jaxpr(tfm.apply_rope)(xs, tab).eqns} >= {
        "concatenate",
        "slice",
    }
    concat_of_x = [
        e for e in eqns if e.primitive.name == "concatenate" and e.outvars[0].aval.shape[:-1] == xs.shape[:-1]
    ]
    assert not concat_of_x
