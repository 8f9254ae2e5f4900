"""The compiled GRPO train step: same seed same bits, jit == no-jit, no recompiles, non-finite skips."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ControllerConfig, ObjectiveConfig, OptimConfig
from grpo_jax.envs import token_task as tt
from grpo_jax.policies import sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.state import init_state, make_optimizer
from grpo_jax.train.step import make_train_step
from grpo_jax.types import batch_from_samples

CFG = tfm.TransformerConfig(
    vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
B, G, P, T = 4, 4, 6, 5


def _batch(params, seed=0):
    prompt, pmask = tt.make_prompts(jax.random.PRNGKey(seed), B, P, CFG.vocab_size)
    out = sampling.make_sampler(CFG, group=G, max_new=T, eos_id=1, pad_id=0)(
        params, prompt, pmask, jax.random.PRNGKey(100 + seed), sampling.sampling_params(1.0)
    )
    r = tt.rewards(prompt, out.tokens, CFG.vocab_size)
    return batch_from_samples(prompt, pmask, out, r)


def _setup(obj=ObjectiveConfig(kl_coef=0.04, entropy_coef=0.01), jit=True, lr=1e-2):
    optimizer = make_optimizer(OptimConfig(learning_rate=lr))
    params = tfm.init_params(CFG, jax.random.PRNGKey(0))
    state = init_state(params, obj, optimizer, seed=0)
    step = make_train_step(CFG, obj, optimizer, jit=jit)
    return state, step


def test_metrics_have_seed_names_and_diagnostics():
    state, step = _setup()
    state, m, _ = step(state, _batch(state.params))
    for name in (
        "Policy/Entropy",
        "Training/AdvantageNorm",
        "Performance/SuccessRate",
        "loss",
        "kl",
        "clip_ratio/low",
        "clip_ratio/high",
        "grad_norm",
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "completions/mean_length",
        "coef/kl",
        "coef/entropy",
        "logp_mismatch",
    ):
        assert name in m and np.isfinite(float(m[name])), name
    assert int(state.step) == 1
    # on-policy (mu = 1): ratio exactly 1, nothing clipped; sampler and trainer log-probs agree
    assert float(m["ratio/mean"]) == pytest.approx(1.0, abs=1e-6)
    assert float(m["clip_ratio/region"]) == 0.0
    assert float(m["logp_mismatch"]) < 1e-5
    assert float(m["kl"]) == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 0


def _run(n, jit=True, obj=ObjectiveConfig(kl_coef=0.04, entropy_coef=0.01), lr=1e-2):
    state, step = _setup(obj, jit=jit, lr=lr)
    ms = []
    for i in range(n):
        state, m, _ = step(state, _batch(state.params, seed=i))
        ms.append(jax.device_get(m))
    return jax.device_get(state), ms


def test_same_seed_is_bit_identical():
    s1, m1 = _run(3)
    s2, m2 = _run(3)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(m1, m2, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_jit_equals_no_jit():
    # Adam normalises each gradient component, so float-rounding differences in near-zero components move
    # parameters by up to ~lr: compare at a small learning rate.
    s1, m1 = _run(1, jit=True, lr=1e-4)
    s2, m2 = _run(1, jit=False, lr=1e-4)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for k in m1[-1]:
        np.testing.assert_allclose(m1[-1][k], m2[-1][k], atol=1e-5, rtol=1e-5, err_msg=k)


def test_second_call_does_not_recompile_and_coefficients_are_data():
    obj = ObjectiveConfig(
        kl_coef=0.04,
        entropy_coef=0.01,
        controller=ControllerConfig("seed_entropy", "entropy_coef", target=5.0),
    )
    state, step = _setup(obj)
    coefs = []
    for i in range(3):
        state, m, _ = step(state, _batch(state.params, seed=i))
        coefs.append(float(m["coef/entropy"]))
    assert step._cache_size() == 1
    # entropy (< 0.8 * 5.0) is below target: the seed's rule raises the coefficient by 1.2x (cap 0.02)
    np.testing.assert_allclose(coefs, [0.01, 0.012, 0.0144], rtol=1e-6)


def test_nonfinite_gradient_skips_update_and_is_counted():
    state, step = _setup()
    batch = _batch(state.params)
    before = jax.device_get(state.params)
    good_ref = jax.tree.map(jnp.copy, state.ref_params)
    # a NaN reference log-prob makes the KL term, the loss and the gradient non-finite
    poisoned = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), state.ref_params)
    state, m, _ = step(state.replace(ref_params=poisoned), batch)
    assert not np.isfinite(float(m["loss"]))
    assert float(m["nonfinite/skipped_total"]) == 1.0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(state.params)), strict=True):
        np.testing.assert_array_equal(a, b)
    state, m, _ = step(state.replace(ref_params=good_ref), batch)  # training goes on
    assert float(m["nonfinite/skipped_total"]) == 1.0 and float(m["nonfinite/consecutive"]) == 0.0
    assert np.isfinite(float(m["loss"]))


def test_nonfinite_rewards_are_counted_and_neutralised():
    state, step = _setup()
    batch = _batch(state.params)
    bad = batch.replace(rewards=batch.rewards.at[0, 0].set(jnp.nan))
    _, m, _ = step(state, bad)
    assert float(m["nonfinite/rewards"]) == 1.0
    assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["reward"]))


def test_multiple_iterations_move_off_policy():
    obj = ObjectiveConfig(kl_coef=0.0, num_iterations=3)
    state, step = _setup(obj)
    state, m, _ = step(state, _batch(state.params))
    assert float(m["ratio/min"]) < 1.0 < float(m["ratio/max"])  # later epochs are off π_old
    assert float(m["loss/final_iteration"]) != float(m["loss"])
    assert state.ref_params is None  # kl_coef = 0 and no KL controller: no reference model is kept


@pytest.mark.parametrize("mini", [1, 2])
def test_policy_diagnostics_cover_every_update(mini):
    """With μ > 1 the logged ratio, clip, KL-to-π_old and grad_norm diagnostics are over EVERY update of the
    step (TRL logs each), not the first epoch's alone: at μ = 1 the ratio is exactly 1 and the KL to π_old
    0, so a first-epoch-only log would show 1 / 0 / the μ = 1 gradient norm whatever μ does."""
    from grpo_jax.config import PolicyLossConfig

    def run(mu, **kw):
        obj = ObjectiveConfig(kl_coef=0.04, num_iterations=mu, mini_batches=mini, **kw)
        state, step = _setup(obj, lr=3e-2)
        return {k: float(v) for k, v in step(state, _batch(state.params))[1].items()}

    one = run(1)
    many = run(3, loss=PolicyLossConfig(kl_anchor="old"))  # the KL to π_old: 0 at the first update only
    if mini == 1:  # the plain step's first update is on-policy
        assert one["ratio/mean"] == pytest.approx(1.0, abs=1e-6)
    assert abs(many["ratio/mean"] - 1.0) > 1e-3
    assert many["ratio/max"] > 1.0 + 1e-3 and many["ratio/min"] < 1.0 - 1e-3
    assert many["grad_norm"] != pytest.approx(one["grad_norm"], rel=1e-3)  # the mean over the updates
    assert many["clip_ratio/region"] > 0.0  # lr 3e-2 moves some tokens out of [0.8, 1.2] by epoch 3
    assert many["kl"] > 1e-6


def test_group_mask_excludes_members():
    """A masked group's data cannot change the update; without the mask the same data does."""
    state, step = _setup(ObjectiveConfig(kl_coef=0.0, entropy_coef=0.01))
    batch = _batch(state.params)
    masked = batch.replace(group_mask=batch.group_mask.at[0].set(0.0))
    # the masked group 0 gets other rewards and other completions
    scrambled = masked.replace(
        rewards=masked.rewards.at[0].set(jnp.array([1.0, 0.0, 1.0, 0.0])),
        completions=masked.completions.at[0].set((masked.completions[0] + 3) % CFG.vocab_size),
    )

    def run(b):
        s, m, out = step(jax.tree.map(jnp.copy, state), b)
        return jax.device_get(s.params), {k: float(v) for k, v in m.items()}, jax.device_get(out)

    p1, m1, o1 = run(masked)
    p2, m2, o2 = run(scrambled)
    jax.tree.map(np.testing.assert_array_equal, p1, p2)
    assert m1["loss"] == m2["loss"] and m1["grad_norm"] == m2["grad_norm"]
    np.testing.assert_array_equal(o1["advantages"][0], np.zeros(G))  # masked members: advantage 0
    assert m1["reward"] == pytest.approx(float(jnp.mean(batch.rewards[1:])), abs=1e-6)
    # the same scrambled data without the mask moves the parameters differently
    p3, m3, _ = run(scrambled.replace(group_mask=jnp.ones((B, G))))
    assert m3["loss"] != m1["loss"]
    assert any(
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p3), strict=True)
    )


def test_kl_schedule_drives_beta_by_step_without_recompiling():
    obj = ObjectiveConfig(kl_coef=0.03, kl_schedule=((0, 0.03), (2, 0.01), (4, 0.005)))
    state, step = _setup(obj)
    coefs = []
    for i in range(5):
        state, m, _ = step(state, _batch(state.params, seed=i))
        coefs.append(float(m["coef/kl"]))
    np.testing.assert_allclose(coefs, [0.03, 0.03, 0.01, 0.01, 0.005], rtol=1e-6)
    assert step._cache_size() == 1 and state.ref_params is not None


def test_soft_overlong_punishment_is_added_to_the_rewards():
    # L_max = T = 5, L_cache = 2: lengths <= 3 -> 0, 4 -> (3 - 4) / 2 = -0.5, 5 -> -1 (DAPO eq. 13)
    obj = ObjectiveConfig(kl_coef=0.0, overlong_cache_len=2, loss=ObjectiveConfig().loss.__class__(max_len=T))
    state, step = _setup(obj)
    batch = _batch(state.params)
    lengths = jnp.array([5, 4, 3, 2])
    mask = (jnp.arange(T)[None, None, :] < lengths[None, :, None]).astype(jnp.float32)  # [1, G, T]
    batch = batch.replace(completion_mask=jnp.broadcast_to(mask, (B, G, T)), rewards=jnp.ones((B, G)))
    _, m, out = step(state, batch)
    np.testing.assert_allclose(out["rewards"], np.tile([0.0, 0.5, 1.0, 1.0], (B, 1)), atol=1e-6)
    assert float(m["reward/overlong"]) == pytest.approx(-1.5 / 4, abs=1e-6)
    assert float(m["reward/correctness"]) == pytest.approx(1.0)
    assert float(m["Performance/SuccessRate"]) == pytest.approx(1.0)  # success is the correctness reward
    with pytest.raises(ValueError, match="max_len"):
        make_train_step(CFG, ObjectiveConfig(overlong_cache_len=2), make_optimizer(OptimConfig()))


def test_objective_validation_messages():
    with pytest.raises(ValueError, match="adv_method"):
        ObjectiveConfig(adv_method="zscore")
    with pytest.raises(ValueError, match="acts_on"):
        ControllerConfig(kind="seed_entropy", acts_on="beta")
    with pytest.raises(ValueError, match="learning_rate"):
        OptimConfig(learning_rate=0.0)
    assert dataclasses.replace(ObjectiveConfig(), kl_coef=0.0).uses_reference is False


def test_tis_weights_are_logged_and_capped():
    from grpo_jax.config import PolicyLossConfig

    obj = ObjectiveConfig(kl_coef=0.0, loss=PolicyLossConfig(tis_cap=2.0))
    state, step = _setup(obj=obj)
    batch = _batch(state.params)
    # behaviour log-probs 1 nat below the policy's: raw weight e ≈ 2.718 > C = 2 on every token
    batch = batch.replace(logp_sampler=batch.logp_sampler - 1.0)
    _, m, _ = step(state, batch)
    np.testing.assert_allclose(m["tis/weight_mean"], 2.0, rtol=1e-5)
    np.testing.assert_allclose(m["tis/capped_frac"], 1.0)


def test_frac_reward_zero_std_counts_the_groups_dynamic_sampling_masked_out():
    """Dynamic sampling keeps the groups with a signal and fills the batch with all-equal groups masked out of
    the loss (group_mask 0): those still count as zero-std groups. When every group was dropped the step
    reports 1, not 0 (the groups are all zero-std)."""
    state, step = _setup(ObjectiveConfig(kl_coef=0.0))
    batch = _batch(state.params)
    mixed = jnp.tile(jnp.array([1.0, 0.0, 0.0, 1.0]), (B, 1))
    # groups 0-1 kept (mixed rewards), groups 2-3 filler (all-equal rewards, masked out)
    filler = jnp.concatenate([mixed[:2], jnp.zeros((2, G))])
    gm = jnp.concatenate([jnp.ones((2, G)), jnp.zeros((2, G))])
    _, m, _ = step(jax.tree.map(jnp.copy, state), batch.replace(rewards=filler, group_mask=gm))
    assert float(m["frac_reward_zero_std"]) == pytest.approx(0.5)
    # every group dropped: the whole batch is filler
    _, m, _ = step(state, batch.replace(rewards=jnp.zeros((B, G)), group_mask=jnp.zeros((B, G))))
    assert float(m["frac_reward_zero_std"]) == pytest.approx(1.0)
