"""The policy pool (grpo_jax.pool): ring buffer, masks, K as data, vmap == loop, pool baseline on literal
inputs, exploration members, diversity; reference updates (frozen / hard / EMA) and LoRA adapters-only
training in the train step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import pool
from grpo_jax.config import ObjectiveConfig, OptimConfig, PoolConfig
from grpo_jax.core.advantages import pool_baseline_advantages
from grpo_jax.envs import token_task as tt
from grpo_jax.policies import lora, sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.state import init_state, make_optimizer
from grpo_jax.train.step import make_train_step, update_reference
from grpo_jax.types import batch_from_samples

CFG = tfm.TransformerConfig(
    vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
B, G, P, T = 3, 4, 6, 5


def _scalar_pool(capacity, pushes, **kw):
    p = pool.init({"w": jnp.zeros(())}, capacity)
    for n in range(pushes):
        p = pool.push(p, {"w": jnp.float32(n)}, step=10 * (n + 1), **kw)
    return p


# ---------------------------------------------------------------------------------------------- pool state


def test_ring_buffer_order_recency_and_ages():
    p = _scalar_pool(3, 5)  # pushes 0..4 into slots n % 3: slot0 <- 0 then 3, slot1 <- 1 then 4, slot2 <- 2
    np.testing.assert_array_equal(p.params["w"], [3.0, 4.0, 2.0])
    np.testing.assert_array_equal(p.push_index, [3, 4, 2])
    np.testing.assert_array_equal(pool.recency(p), [1, 0, 2])  # slot1 is the newest
    np.testing.assert_array_equal(pool.ages(p, 60), [20, 10, 30])  # pushed at steps 40, 50, 30
    np.testing.assert_array_equal(pool.active_mask(p, 2), [True, True, False])
    np.testing.assert_array_equal(pool.active_mask(p, 1), [False, True, False])
    assert int(p.pushes) == 5


def test_unfilled_slots_are_masked():
    p = _scalar_pool(4, 2)
    np.testing.assert_array_equal(p.valid, [True, True, False, False])
    np.testing.assert_array_equal(pool.active_mask(p, 4), [True, True, False, False])
    np.testing.assert_array_equal(pool.ages(p, 25), [15, 5, -1, -1])
    idx, m = pool.select_members(p, 4, jax.random.PRNGKey(0), 4)
    assert sorted(np.asarray(idx)[:2].tolist()) == [0, 1]  # the two active slots come first
    np.testing.assert_array_equal(m, [True, True, False, False])
    idx, m = pool.select_members(p, 1, jax.random.PRNGKey(0), 2)  # K = 1: only the newest (slot 1)
    assert int(idx[0]) == 1 and np.asarray(m).tolist() == [True, False]


def test_k_change_does_not_recompile():
    p = _scalar_pool(8, 8)
    traces = []

    def counted(*args):  # runs once per trace: a new K that retraced would be counted
        traces.append(1)
        return pool.select_members(*args)

    select = jax.jit(counted, static_argnums=3)
    counts = []
    for k in (2, 5, 8):  # the seed's K schedule is data
        _, m = select(p, jnp.int32(k), jax.random.PRNGKey(k), 8)
        counts.append(int(np.asarray(m).sum()))
    assert counts == [2, 5, 8]
    assert len(traces) == 1
    cfg = PoolConfig(capacity=32, k_schedule=((0, 8), (100, 16), (500, 32)))
    assert [cfg.k_at(s) for s in (0, 99, 100, 499, 500, 10**6)] == [8, 8, 16, 16, 32, 32]


def test_exploration_pushes_and_param_noise():
    flags = [bool(pool.is_exploration_push(n, 0.2)) for n in range(10)]
    assert flags == [False, False, False, False, True, False, False, False, False, True]
    p = pool.init({"w": jnp.ones((64,))}, 5)
    for n in range(5):
        p = pool.push(
            p, {"w": jnp.ones((64,))}, step=n, explore_fraction=0.2, noise=0.1, key=jax.random.PRNGKey(n)
        )
    np.testing.assert_array_equal(p.explore, [False, False, False, False, True])
    w = np.asarray(p.params["w"])
    np.testing.assert_array_equal(w[:4], 1.0)  # ordinary members are exact snapshots
    assert 0.05 < np.std(w[4] - 1.0) < 0.2  # the exploration member carries ~0.1 x RMS noise
    temps = pool.member_temperatures(p, jnp.array([4, 0]), 1.0, 1.7, True)
    np.testing.assert_allclose(temps, [1.7, 1.0])


def test_diversity_literal():
    p = pool.init({"a": jnp.zeros((2,))}, 3)
    p = pool.push(p, {"a": jnp.array([1.0, 0.0])}, step=1)
    assert float(pool.diversity(p, 3)) == 0.0  # one member: no spread
    p = pool.push(p, {"a": jnp.array([0.0, 1.0])}, step=2)
    # ||θ1 − θ2||² = 2, mean ||θ||² = 1 -> D = 2
    np.testing.assert_allclose(pool.diversity(p, 3), 2.0, rtol=1e-6)
    p = pool.push(p, {"a": jnp.array([0.0, 1.0])}, step=3)
    # pairs: (1,2) 2, (1,3) 2, (2,3) 0 -> mean 4/3; mean ||θ||² = 1
    np.testing.assert_allclose(pool.diversity(p, 3), 4.0 / 3.0, rtol=1e-6)
    np.testing.assert_allclose(pool.diversity(p, 1), 0.0)


def test_returns_baseline_ignores_masked_members_and_nan():
    r = jnp.array(
        [
            [[1.0, 0.0], [0.0, 0.0]],  # member 0: prompt 0 mean 0.5, prompt 1 mean 0
            [[1.0, 1.0], [jnp.nan, 1.0]],  # member 1: prompt 1 has one lost (NaN) result
            [[9.0, 9.0], [9.0, 9.0]],  # member 2 is inactive
        ]
    )
    b, has = pool.returns_baseline(r, jnp.array([True, True, False]))
    np.testing.assert_allclose(b, [0.75, 1.0 / 3.0], rtol=1e-6)  # (1+0+1+1)/4, (0+0+1)/3
    np.testing.assert_array_equal(has, [True, True])
    b, has = pool.returns_baseline(r, jnp.array([False, False, False]))
    np.testing.assert_array_equal(has, [False, False])


# ---------------------------------------------------------------------------------- pool baseline advantages


def test_pool_baseline_advantages_literal():
    r = jnp.array(
        [
            [0.0, 0.0, 0.0, 0.0],  # all fail, pool passed 25% -> every member below the pool
            [1.0, 1.0, 1.0, 1.0],  # all pass, pool passed 50% -> every member above the pool
            [1.0, 0.0, 0.0, 1.0],  # T1b: scale-only form
            [1.0, 0.0, 0.0, 1.0],  # no pool returns for this prompt -> canonical GRPO z-score
        ]
    )
    b = jnp.array([0.25, 0.5, 0.25, 0.9])
    valid = jnp.array([1.0, 1.0, 1.0, 0.0])
    a = pool_baseline_advantages(r, b, valid, mix=1.0, ddof=1, eps=0.0)
    s = 1.299038  # 0.75 / std_ddof1([1,0,0,1]) = 0.75 / 0.577350
    expected = [
        [-0.25] * 4,  # (0 − 0.25) / std_floor 1
        [0.5] * 4,
        [s, -0.433013, -0.433013, s],
        [0.866025, -0.866025, -0.866025, 0.866025],
    ]
    np.testing.assert_allclose(a, expected, atol=1e-6)
    # the group baseline gives all-equal groups nothing; the pool gives them a signal
    assert float(jnp.abs(a[0]).sum()) > 0 and float(jnp.abs(a[1]).sum()) > 0
    # mix 0.5 on the T1b group: b = 0.5*0.25 + 0.5*0.5 = 0.375 -> (1-0.375)/0.57735, (0-0.375)/0.57735
    m = pool_baseline_advantages(r, b, valid, mix=0.5, ddof=1, eps=0.0)
    np.testing.assert_allclose(m[2], [1.082532, -0.649519, -0.649519, 1.082532], atol=1e-6)
    # mix 0.5 on an all-fail group: b = 0.5*0.25 + 0.5*0 = 0.125 -> -0.125 / floor
    np.testing.assert_allclose(m[0], [-0.125] * 4, atol=1e-7)
    # mix 0 is exactly canonical GRPO (all-equal groups give 0)
    z = pool_baseline_advantages(r, b, valid, mix=0.0, ddof=1, eps=0.0)
    np.testing.assert_allclose(z[0], 0.0)
    np.testing.assert_allclose(z[2], expected[3], atol=1e-6)
    # std floor 2 halves the all-equal advantages; masked members give 0
    f = pool_baseline_advantages(r[:1], b[:1], valid[:1], std_floor=2.0, mask=jnp.array([[1, 1, 1, 0]]))
    np.testing.assert_allclose(f, [[-0.125, -0.125, -0.125, 0.0]], atol=1e-7)


def test_objective_baseline_validation():
    with pytest.raises(ValueError, match="baseline"):
        ObjectiveConfig(baseline="pool", adv_method="dr_grpo")
    with pytest.raises(ValueError, match="baseline"):
        ObjectiveConfig(baseline="league")
    with pytest.raises(ValueError, match="ref_update"):
        ObjectiveConfig(ref_update="ema", kl_coef=0.0)
    with pytest.raises(ValueError, match="k_schedule"):
        PoolConfig(capacity=8, k_schedule=((0, 4), (10, 16)))
    with pytest.raises(ValueError, match="k_schedule"):
        PoolConfig(capacity=8, k_schedule=((5, 4),))


# -------------------------------------------------------------------------------------- vmap == Python loop


def _members(n):
    return [tfm.init_params(CFG, jax.random.PRNGKey(10 + i)) for i in range(n)]


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _prompts():
    return tt.make_prompts(jax.random.PRNGKey(3), B, P, CFG.vocab_size)


def test_vmapped_logp_equals_loop():
    members = _stack(_members(3))
    prompt, pmask = _prompts()
    comps = jax.random.randint(jax.random.PRNGKey(4), (B, G, T), 2, CFG.vocab_size)

    def logp_fn(params, prompt, pmask, comps):
        return tfm.token_logp(tfm.forward_grouped(params, CFG, prompt, pmask, comps)[0], comps)[0]

    v = jax.jit(lambda m: pool.member_logp(logp_fn, m, prompt, pmask, comps))(members)
    loop = pool.loop_logp(jax.jit(logp_fn), members, prompt, pmask, comps)
    assert v.shape == (3, B, G, T)
    np.testing.assert_allclose(v, loop, atol=2e-5)
    assert float(jnp.abs(v[0] - v[1]).max()) > 1e-3  # the members are different policies


def test_vmapped_member_sampling_equals_per_member_sampler():
    params = _members(3)
    p = pool.init(params[0], 4)
    for i, x in enumerate(params):
        p = pool.push(p, x, step=i)
    prompt, pmask = _prompts()
    msample = pool.make_member_sampler(CFG, group=2, max_new=T, eos_id=1, pad_id=0)
    idx = jnp.array([2, 0, 1], jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    temps = jnp.array([1.0, 1.5, 0.7])
    out = msample(p.params, idx, None, prompt, pmask, keys, temps, jnp.int32(0), jnp.float32(1.0))
    single = sampling.make_sampler(CFG, group=2, max_new=T, eos_id=1, pad_id=0)
    for j, (i, t) in enumerate(zip([2, 0, 1], [1.0, 1.5, 0.7], strict=True)):
        ref = single(params[i], prompt, pmask, keys[j], sampling.sampling_params(t))
        np.testing.assert_array_equal(out.tokens[j], ref.tokens)
        np.testing.assert_allclose(out.logp[j], ref.logp, atol=2e-5)


def _lora_members(base, n):
    """n rank-2 adapters with non-zero B (a fresh adapter's B = 0 would make every member the base)."""
    out = []
    for i in range(n):
        ad = lora.init(base, jax.random.PRNGKey(20 + i), rank=2)
        ad = jax.tree.map(lambda x, i=i: x + 0.3 * jax.random.normal(jax.random.PRNGKey(40 + i), x.shape), ad)
        out.append(ad)
    return out


def test_batched_lora_members_equal_each_merged_model():
    """lora.merge_members on member-major rows: one base matmul, per-member deltas; row block i is the model
    lora.merge(base, member_i) (log-probs and sampled tokens), and the members really differ."""
    base = tfm.init_params(CFG, jax.random.PRNGKey(0))
    ads = _lora_members(base, 3)
    prompt, pmask = _prompts()
    comps = jax.random.randint(jax.random.PRNGKey(4), (B, G, T), 2, CFG.vocab_size)

    def logp_fn(params, prompt, pmask, comps):
        return tfm.token_logp(tfm.forward_grouped(params, CFG, prompt, pmask, comps)[0], comps)[0]

    got = jax.jit(lambda a: pool.lora_member_logp(logp_fn, base, a, 4.0, prompt, pmask, comps))(_stack(ads))
    one = jax.jit(lambda a: logp_fn(lora.merge(base, a, alpha=4.0), prompt, pmask, comps))
    want = jnp.stack([one(a) for a in ads])
    assert got.shape == (3, B, G, T)
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert float(jnp.abs(want[0] - want[1]).max()) > 1e-2  # the members are different policies

    p = pool.init(ads[0], 4)
    for i, a in enumerate(ads):
        p = pool.push(p, a, step=i)
    msample = pool.make_member_sampler(CFG, group=2, max_new=T, eos_id=1, pad_id=0, lora_alpha=4.0)
    idx = jnp.array([2, 0, 1], jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    temps = jnp.array([1.0, 1.5, 0.7])
    out = msample(p.params, idx, base, prompt, pmask, keys, temps, jnp.int32(0), jnp.float32(1.0))
    assert out.tokens.shape == (3, B, 2, T)
    single = sampling.make_sampler(CFG, group=2, max_new=T, eos_id=1, pad_id=0)
    for j, (i, t) in enumerate(zip([2, 0, 1], [1.0, 1.5, 0.7], strict=True)):
        ref = single(lora.merge(base, ads[i], alpha=4.0), prompt, pmask, keys[j], sampling.sampling_params(t))
        np.testing.assert_array_equal(out.tokens[j], ref.tokens)
        np.testing.assert_allclose(out.logp[j], ref.logp, atol=2e-5)
        np.testing.assert_array_equal(out.mask[j], ref.mask)


# --------------------------------------------------------------------------------- reference updates


def test_reference_update_arithmetic():
    ref, params = {"w": jnp.array([1.0, -2.0])}, {"w": jnp.array([3.0, 2.0])}
    ema = ObjectiveConfig(kl_coef=0.1, ref_update="ema", ref_ema_tau=0.25)
    new, due = update_reference(ref, params, jnp.int32(1), ema)
    np.testing.assert_allclose(new["w"], [1.5, -1.0])  # 1 + 0.25 (3 − 1), −2 + 0.25 (2 + 2)
    assert float(due) == 1.0
    hard = ObjectiveConfig(kl_coef=0.1, ref_update="hard", ref_update_every=2)
    new, due = update_reference(ref, params, jnp.int32(3), hard)
    np.testing.assert_array_equal(new["w"], ref["w"])  # step 3: not due
    assert float(due) == 0.0
    new, _ = update_reference(ref, params, jnp.int32(4), hard)
    np.testing.assert_array_equal(new["w"], params["w"])
    frozen, _ = update_reference(ref, params, jnp.int32(4), ObjectiveConfig(kl_coef=0.1))
    np.testing.assert_array_equal(frozen["w"], ref["w"])


def _batch(params, seed=0):
    prompt, pmask = _prompts()
    out = sampling.make_sampler(CFG, group=G, max_new=T, eos_id=1, pad_id=0)(
        params, prompt, pmask, jax.random.PRNGKey(100 + seed), sampling.sampling_params(1.0)
    )
    r = tt.rewards(prompt, out.tokens, CFG.vocab_size)
    return batch_from_samples(prompt, pmask, out, r)


def test_ema_reference_in_train_step():
    obj = ObjectiveConfig(kl_coef=0.04, ref_update="ema", ref_ema_tau=0.5)
    opt = make_optimizer(OptimConfig(learning_rate=1e-2))
    params = tfm.init_params(CFG, jax.random.PRNGKey(0))
    state = init_state(params, obj, opt, seed=0)
    ref0 = jax.device_get(state.ref_params)
    step = make_train_step(CFG, obj, opt)
    state, m, _ = step(state, _batch(params))
    p1, r1 = jax.device_get(state.params), jax.device_get(state.ref_params)
    # π_ref ← π_ref + 0.5 (π_θ − π_ref) with π_θ the updated parameters
    want = jax.tree.map(lambda r, p: r + 0.5 * (p - r), ref0, p1)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7), r1, want)
    assert float(m["ref/updated"]) == 1.0


# ------------------------------------------------------------------------------------------- LoRA training


def test_lora_train_step_updates_adapters_only_and_reference_is_the_base():
    obj = ObjectiveConfig(kl_coef=0.04)
    opt = make_optimizer(OptimConfig(learning_rate=1e-2))
    base = tfm.init_params(CFG, jax.random.PRNGKey(0))
    adapters = lora.init(base, jax.random.PRNGKey(1), rank=2)
    state = init_state(adapters, obj, opt, seed=0)
    frozen = jax.tree.map(jnp.copy, base)  # read-only: RunState.frozen, not donated

    def param_fn(a, b):
        return lora.merge(jax.lax.stop_gradient(b), a, alpha=4.0)

    step = make_train_step(CFG, obj, opt, param_fn=param_fn)
    base_before = jax.device_get(base)
    ad_before = jax.device_get(adapters)
    batch = _batch(base)
    state, m, _ = step(state, batch, frozen)
    assert float(m["kl"]) == 0.0  # B = 0: the policy and the reference (the base) are the same function
    state, m, _ = step(state, _batch(base, seed=1), frozen)
    assert float(m["kl"]) > 0.0
    # the base is bit-identical, the adapters moved
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(frozen), base_before)
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), jax.device_get(state.params), ad_before)
    assert max(jax.tree.leaves(moved)) > 0
    # the optimiser state holds adapter moments only
    n_opt = sum(x.size for x in jax.tree.leaves(state.opt_state) if getattr(x, "ndim", 0) > 0)
    assert n_opt == 2 * lora.num_params(adapters)


def test_lora_pool_memory_is_k_times_adapters():
    base = tfm.init_params(CFG, jax.random.PRNGKey(0))
    adapters = lora.init(base, jax.random.PRNGKey(1), rank=2)
    full, small = pool.init(base, 8), pool.init(adapters, 8)
    assert lora.num_params(full.params) == 8 * lora.num_params(base)
    assert lora.num_params(small.params) == 8 * lora.num_params(adapters)
    assert lora.num_params(small.params) < lora.num_params(full.params) / 2


def test_pool_baseline_in_train_step():
    obj = ObjectiveConfig(kl_coef=0.0, baseline="pool")
    opt = make_optimizer(OptimConfig(learning_rate=1e-3))
    params = tfm.init_params(CFG, jax.random.PRNGKey(0))
    state = init_state(jax.tree.map(jnp.copy, params), obj, opt, seed=0)  # the step donates its state
    step = make_train_step(CFG, obj, opt)
    b = _batch(params)
    b = b.replace(rewards=jnp.zeros((B, G)), baseline=jnp.full((B,), 0.5), baseline_valid=jnp.ones((B,)))
    state, m, _ = step(state, b)
    # all groups fail, the pool passed half the time: every advantage is (0 − 0.5) / 1
    np.testing.assert_allclose(m["Training/AdvantageNorm"], 0.5, rtol=1e-6)
    np.testing.assert_allclose(m["adv/mean"], -0.5, rtol=1e-6)
    assert float(m["pool/frac_zero_std_with_signal"]) == 1.0
    assert float(m["grad_norm"]) > 0
    # the canonical objective on the same batch gives no gradient at all
    obj_g = dataclasses.replace(obj, baseline="group")
    step_g = make_train_step(CFG, obj_g, opt)
    _, mg, _ = step_g(init_state(params, obj_g, opt, seed=0), b)
    assert float(mg["Training/AdvantageNorm"]) == 0.0
