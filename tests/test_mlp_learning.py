"""Learning tests: GRPO on the toy bandits and PPO on the toy chain improve, with robust margins.

Steps are nearly free here: each test's time is the XLA compile of one train_step (~5 s of CPU), so the step
counts give the thresholds a wide margin. Measured over seeds 0–5 (hidden 64, float32, this CPU):

* GRPO discrete bandit (A = 8, chance 0.125), 100 steps: sampled success 0.11–0.14 -> 0.74–0.83 (min over
  seeds); the test asks for >= 3 × chance = 0.375.
* GRPO continuous bandit (A = 2), 150 steps: sampled reward 0.31–0.40 -> 0.65–0.72, greedy (mean action)
  reward -> 0.98–0.99.
* PPO chain (n = 8, horizon 8), 30 steps: return 0.13–0.30 -> 1.0 (by ~10 steps); value loss 0.04–0.08 ->
  ~1e-4; V(s_0) within 0.03 of the true value.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.envs import toy
from grpo_jax.policies import mlp
from grpo_jax.train import mlp_agent as agent

HID = 64
STEPS_DISCRETE = 100
STEPS_CONTINUOUS = 150
STEPS_PPO = 30


def _finite(history):
    for metrics in history:
        for name, value in metrics.items():
            assert np.isfinite(value), f"metric {name} is not finite: {value}"


def _run_grpo(kind, seed, steps, **cfg_kw):
    act_dim = 8 if kind == "discrete" else 2
    make = toy.make_discrete_bandit if kind == "discrete" else toy.make_continuous_bandit
    task = make(seed=seed, obs_dim=8, act_dim=act_dim)
    cfg = agent.GRPOAgentConfig(num_prompts=64, group_size=8, **cfg_kw)
    state = agent.grpo_init(jax.random.key(seed), mlp.MLPPolicyConfig(8, act_dim, kind, hidden=HID), cfg)
    init_params = jax.device_get(state.params)  # the state is donated: keep a host copy
    init_opt_size = sum(x.size for x in jax.tree.leaves(state.opt_state))
    before = jax.device_get(agent.evaluate_bandit(state.params, task, jax.random.key(seed + 99)))
    train_step = agent.make_grpo_train_step(task, cfg)
    state, history = agent.run(train_step, state, jax.random.key(seed + 1), steps)
    after = jax.device_get(agent.evaluate_bandit(state.params, task, jax.random.key(seed + 99)))
    return dict(
        task=task,
        state=state,
        history=history,
        before=before,
        after=after,
        init_params=init_params,
        init_opt_size=init_opt_size,
        train_step=train_step,
    )


def _run_ppo(seed, steps):
    env = toy.Chain(n=8, horizon=8)
    cfg = agent.PPOAgentConfig(num_envs=64, num_epochs=4, num_minibatches=4)
    state = agent.ppo_init(jax.random.key(seed), mlp.MLPPolicyConfig(env.obs_dim, 2, hidden=HID), cfg)
    train_step = agent.make_ppo_train_step(env, cfg)
    state, history = agent.run(train_step, state, jax.random.key(seed + 1), steps)
    # true value at t = 0 of the greedy policy (always right): reward 1 after min_steps steps -> γ^(steps − 1)
    pos = jnp.arange(env.n - 2, dtype=jnp.int32)
    s0 = toy.ChainState(pos=pos, t=jnp.zeros_like(pos), done=jnp.zeros(pos.shape, bool))
    v = np.asarray(mlp.value(state.params, env.observe(s0)))
    target = cfg.gamma ** np.asarray(env.min_steps(pos) - 1, np.float32)
    return dict(state=state, history=history, v=v, v_target=target, train_step=train_step)


def test_grpo_discrete_bandit_learns_and_critic_stays_frozen():
    # non-zero weight decay: a plain AdamW over all params would shrink the critic even with zero gradient
    r = _run_grpo("discrete", 0, STEPS_DISCRETE, weight_decay=0.01)
    before, after, history, state = r["before"], r["after"], r["history"], r["state"]
    chance = r["task"].chance
    assert before["reward"] < 2 * chance, before
    assert after["reward"] >= 3 * chance and after["greedy_reward"] >= 3 * chance, after
    assert np.mean([m["reward"] for m in history[-5:]]) >= 3 * chance
    assert abs(history[0]["entropy"] - math.log(8)) < 0.01  # actor head init gain 0.01 -> near-uniform start
    assert history[-1]["entropy"] < history[0]["entropy"] - 0.5
    assert history[-1]["kl"] > 0.0
    _finite(history)

    # GRPO is critic-free: no optimiser state for the critic (Adam mu, nu for the rest, + count) ...
    params0 = r["init_params"]
    n_actor = sum(x.size for k, v in params0.items() if k != "critic" for x in jax.tree.leaves(v))
    assert r["init_opt_size"] == 2 * n_actor + 1
    # ... and the critic head is bit-identical after training, while the trunk moved
    chex.assert_trees_all_equal(jax.device_get(state.params["critic"]), params0["critic"])
    assert not np.allclose(jax.device_get(state.params["trunk_0"]["kernel"]), params0["trunk_0"]["kernel"])
    assert int(state.step) == STEPS_DISCRETE
    assert r["train_step"]._cache_size() == 1  # no recompilation across steps


def test_grpo_continuous_bandit_learns():
    r = _run_grpo("continuous", 0, STEPS_CONTINUOUS)
    before, after, history, state = r["before"], r["after"], r["history"], r["state"]
    assert after["reward"] >= before["reward"] + 0.15, (before, after)
    assert after["greedy_reward"] >= 0.85 and after["greedy_reward"] >= before["greedy_reward"] + 0.2
    assert np.mean([m["reward"] for m in history[-5:]]) > np.mean([m["reward"] for m in history[:5]]) + 0.15
    assert float(state.params["log_std"].mean()) < 0.0  # the learned std shrank from its init exp(0) = 1
    chex.assert_trees_all_equal(jax.device_get(state.params["critic"]), r["init_params"]["critic"])
    _finite(history)


def test_ppo_chain_learns_and_critic_fits():
    r = _run_ppo(0, STEPS_PPO)
    returns = [m["episode_return"] for m in r["history"]]
    value_losses = [m["value_loss"] for m in r["history"]]
    assert returns[0] < 0.5, returns  # random policy: ≈ 0.18
    assert np.mean(returns[-3:]) >= 0.9, returns  # optimal: 1.0
    # the loss of the rollout-time critic against its GAE targets falls
    assert np.mean(value_losses[-3:]) < 0.2 * np.mean(value_losses[:3]), value_losses
    _finite(r["history"])
    # the critic head fits the true value of the (near-)greedy policy at t = 0
    np.testing.assert_allclose(r["v"], r["v_target"], atol=0.1)
    assert np.mean(np.abs(r["v"] - r["v_target"])) < 0.05
    assert r["train_step"]._cache_size() == 1
