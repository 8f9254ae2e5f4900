"""Tests for grpo_jax.policies.mlp (the seed's actor-critic MLP) and the toy tasks' basic contracts."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.envs import toy
from grpo_jax.policies import mlp

OBS, ACT, HID = 5, 3, 64
KINDS = ("discrete", "continuous")
LOG_STD_INIT = -0.5
N = 8  # one batch size for all tests: eager ops compile once per shape, which dominates this file's time


def _params(kind, seed=0):
    return mlp.init(jax.random.key(seed), OBS, ACT, kind=kind, hidden=HID, log_std_init=LOG_STD_INIT)


def _obs(shape=(N,), seed=1):
    return jax.random.normal(jax.random.key(seed), (*shape, OBS), jnp.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_shapes(kind):
    params = _params(kind)
    assert params["trunk_0"]["kernel"].shape == (OBS, HID)
    assert params["trunk_1"]["kernel"].shape == (HID, HID)
    assert params["actor"]["kernel"].shape == (HID, ACT)
    assert params["critic"]["kernel"].shape == (HID, 1)
    assert ("log_std" in params) == (kind == "continuous")
    obs = _obs((2, 3))
    out = jax.jit(mlp.apply)(params, obs)
    chex.assert_shape(out.value, (2, 3))
    if kind == "discrete":
        chex.assert_shape(out.logits, (2, 3, ACT))
        assert out.mean is None and out.log_std is None
    else:
        chex.assert_shape([out.mean, out.log_std], (2, 3, ACT))
        assert out.logits is None
    action, logp = jax.jit(mlp.sample)(params, obs, jax.random.key(2))
    chex.assert_shape(action, (2, 3) if kind == "discrete" else (2, 3, ACT))
    assert action.dtype == (jnp.int32 if kind == "discrete" else jnp.float32)
    chex.assert_shape(
        [logp, jax.jit(mlp.logp)(params, obs, action), jax.jit(mlp.entropy)(params, obs)], (2, 3)
    )
    # a single unbatched observation works too
    chex.assert_shape(jax.eval_shape(mlp.apply, params, obs[0, 0]).value, ())


def test_default_hidden_is_the_seeds_1024():
    cfg = mlp.MLPPolicyConfig(obs_dim=OBS, act_dim=ACT)
    assert cfg.hidden == 1024 and cfg.action_space == "discrete"
    shapes = jax.eval_shape(lambda k: mlp.init_from_config(k, cfg), jax.random.key(0))  # no 1024² compute
    assert shapes["trunk_1"]["kernel"].shape == (1024, 1024)


def test_config_validation():
    with pytest.raises(ValueError, match="action_space"):
        mlp.MLPPolicyConfig(OBS, ACT, action_space="box")
    with pytest.raises(ValueError, match="hidden"):
        mlp.MLPPolicyConfig(OBS, ACT, hidden=0)


@pytest.mark.parametrize("kind", KINDS)
def test_logp_of_sample_matches_recomputed(kind):
    params = _params(kind)
    obs = _obs()
    action, logp = mlp.sample(params, obs, jax.random.key(3))
    np.testing.assert_allclose(logp, mlp.logp(params, obs, action), rtol=1e-6, atol=1e-6)


def test_categorical_uniform_logits_literals():
    out = mlp.PolicyOutput(value=jnp.zeros(()), logits=jnp.zeros((4,)))
    np.testing.assert_allclose(mlp.dist_entropy(out), math.log(4), rtol=1e-6)
    np.testing.assert_allclose(mlp.dist_logp(out, jnp.array(2)), -math.log(4), rtol=1e-6)
    # logits [0, log 3] -> p = [1/4, 3/4]; H = -(1/4 log 1/4 + 3/4 log 3/4)
    out = mlp.PolicyOutput(value=jnp.zeros(()), logits=jnp.array([0.0, math.log(3.0)]))
    np.testing.assert_allclose(mlp.dist_logp(out, jnp.array(1)), math.log(0.75), rtol=1e-6)
    np.testing.assert_allclose(
        mlp.dist_entropy(out), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), rtol=1e-6
    )


def test_uniform_policy_entropy_is_log_act_dim():
    # the actor head's zero weights make every logit 0 -> uniform policy
    params = _params("discrete")
    params = {**params, "actor": jax.tree.map(jnp.zeros_like, params["actor"])}
    np.testing.assert_allclose(mlp.entropy(params, _obs()), np.full(N, math.log(ACT)), rtol=1e-6)


def test_gaussian_logp_and_entropy_literals():
    # mean [0, 1], log_std [0, log 2], action [1, 1]:
    # logp = (-1/2 - 0 - ½log2π) + (0 - log 2 - ½log2π) = -1/2 - log 2 - log 2π
    # H    = (0 + ½log2πe) + (log 2 + ½log2πe) = log 2 + log 2π + 1
    out = mlp.PolicyOutput(
        value=jnp.zeros(()), mean=jnp.array([0.0, 1.0]), log_std=jnp.array([0.0, math.log(2.0)])
    )
    np.testing.assert_allclose(
        mlp.dist_logp(out, jnp.array([1.0, 1.0])), -0.5 - math.log(2) - math.log(2 * math.pi), rtol=1e-6
    )
    np.testing.assert_allclose(mlp.dist_entropy(out), math.log(2) + math.log(2 * math.pi) + 1.0, rtol=1e-6)


def test_continuous_policy_uses_learned_clipped_log_std():
    params, obs = _params("continuous"), _obs()
    np.testing.assert_allclose(mlp.apply(params, obs).log_std, np.full((N, ACT), LOG_STD_INIT))
    # entropy of a diagonal Gaussian: A * (log σ + ½ log 2πe), independent of the observation
    h = ACT * (LOG_STD_INIT + 0.5 * math.log(2 * math.pi * math.e))
    np.testing.assert_allclose(mlp.entropy(params, obs), np.full(N, h), rtol=1e-6)
    wild = {**params, "log_std": jnp.array([-50.0, 0.3, 50.0])}
    np.testing.assert_allclose(mlp.apply(wild, obs).log_std[0], [mlp.LOG_STD_MIN, 0.3, mlp.LOG_STD_MAX])


@pytest.mark.parametrize("kind", KINDS)
def test_jit_matches_no_jit(kind):
    params, obs, key = _params(kind), _obs(), jax.random.key(4)
    for fn, args in (
        (mlp.apply, (params, obs)),
        (mlp.sample, (params, obs, key)),
        (mlp.entropy, (params, obs)),
    ):
        chex.assert_trees_all_close(jax.jit(fn)(*args), fn(*args), rtol=1e-5, atol=1e-6)
    action, _ = mlp.sample(params, obs, key)
    chex.assert_trees_all_close(
        jax.jit(mlp.logp)(params, obs, action), mlp.logp(params, obs, action), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("kind", KINDS)
def test_vmap_matches_loop(kind):
    params, obs = _params(kind), _obs()
    keys = jax.random.split(jax.random.key(5), N)
    actions, logps = jax.vmap(mlp.sample, in_axes=(None, 0, 0))(params, obs, keys)
    for i in range(0, N, 3):
        a_i, lp_i = mlp.sample(params, obs[i], keys[i])
        np.testing.assert_allclose(actions[i], a_i, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(logps[i], lp_i, rtol=1e-5, atol=1e-6)
    # vmap over a stacked pytree of params (the pool's layout) == a loop over the members
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *[_params(kind, seed=s) for s in range(3)])
    values = jax.vmap(mlp.value, in_axes=(0, None))(stacked, obs)
    for s in range(3):
        np.testing.assert_allclose(values[s], mlp.value(_params(kind, seed=s), obs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_same_key_same_sample(kind):
    params, obs = _params(kind), _obs()
    a1, l1 = mlp.sample(params, obs, jax.random.key(7))
    a2, l2 = mlp.sample(params, obs, jax.random.key(7))
    a3, _ = mlp.sample(params, obs, jax.random.key(8))
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(l1, l2)
    assert not np.array_equal(a1, a3)
    # same init key -> same params
    chex.assert_trees_all_equal(_params(kind, seed=3), _params(kind, seed=3))


def test_param_labels_mark_only_the_critic():
    labels = mlp.param_labels(_params("continuous"))
    assert labels["critic"] == {"kernel": "critic", "bias": "critic"}
    assert labels["log_std"] == "actor"
    assert {v for k, sub in labels.items() if k != "critic" for v in jax.tree.leaves(sub)} == {"actor"}


def test_toy_tasks_are_deterministic_and_well_formed():
    bandit = toy.make_discrete_bandit(0, OBS, 4)
    chex.assert_trees_all_equal(bandit, toy.make_discrete_bandit(0, OBS, 4))
    obs = bandit.observe(jax.random.key(0), (8,))
    best = bandit.optimal_action(obs)
    np.testing.assert_array_equal(bandit.reward(obs, best), np.ones(8))
    np.testing.assert_array_equal(bandit.reward(obs, (best + 1) % 4), np.zeros(8))
    cont = toy.make_continuous_bandit(0, OBS, 2)
    obs = cont.observe(jax.random.key(0), (8,))
    np.testing.assert_allclose(cont.reward(obs, cont.optimal_action(obs)), np.ones(8))
    # chain: always-right reaches the goal from every start within the horizon, reward exactly once
    env = toy.Chain(n=6, horizon=6)
    state, obs = env.reset(jax.random.key(0), 16)
    chex.assert_shape(obs, (16, env.obs_dim))
    total = jnp.zeros(16)
    step = jax.jit(env.step)
    for _ in range(env.horizon):
        state, obs, reward, done = step(state, jnp.ones(16, jnp.int32))
        total = total + reward
    np.testing.assert_array_equal(total, np.ones(16))
    assert bool(done.all())
