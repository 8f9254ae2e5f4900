"""GRPO and PPO trainers for the seed's MLP actor-critic on the toy tasks (``grpo_jax.envs.toy``).

Both trainers are a pure, jitted ``train_step(state, key) -> (state, metrics)``; the state (a
``flax.struct.dataclass``) is donated. ``key`` is the run's rollout stream: the step folds in ``state.step``
(``jax.random.fold_in``), so passing the same key every step is correct and a resumed run is bit-identical.
Metrics are a flat dict of float32 scalars.

GRPO (DeepSeekMath §4.1, docs/GRPO_MATH.md §1.1) on a one-step bandit — B observations ("prompts"), G
actions each
("completions" of length T = 1)::

    a_{b,i} ~ π_old(·|s_b),  r_{b,i} = task.reward(s_b, a_{b,i})                       [B, G]
    Â_{b,i} = (r_{b,i} − mean_i r_{b,·}) / (std_i(r_{b,·}; ddof) + eps)                  group_zscore
    loss    = −mean_{b,i}[ min(ρ Â, clip(ρ, 1−ε_l, 1+ε_h) Â) − β·k3(π_θ‖π_ref) + c_H·H(π_θ) ]   policy_loss

with π_ref the frozen initial policy and ``num_inner_steps`` (μ) gradient steps per batch (ρ = 1 on the
first). GRPO is critic-free (docs/GRPO_MATH.md §3 row 5): the loss never touches the critic head, and the
optimiser
is an ``optax.multi_transform`` that sends the critic's leaves to ``optax.set_to_zero()`` — no update, no Adam
moments, and no weight decay (plain AdamW over all params would still shrink the critic through weight decay).

PPO (Schulman et al. 2017; GAE Schulman et al. 2016; docs/GRPO_MATH.md §2) on the episodic ``toy.Chain``:
N parallel episodes of at most ``horizon`` steps with a prefix "alive" mask, GAE with V(s_{T+1}) = 0 (every
episode ends by the horizon and the observation carries the time, so the cut is part of the MDP), advantages
whitened over valid steps, then ``num_epochs`` × ``num_minibatches`` (whole episodes per minibatch) of the
clipped policy loss + ``vf_coef`` × clipped value loss − ``entropy_coef`` × entropy; the critic head and the
shared trunk are trained together.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from grpo_jax.algorithms.policy_loss import PolicyInputs, policy_loss
from grpo_jax.algorithms.ppo import ppo_loss
from grpo_jax.config import PolicyLossConfig
from grpo_jax.core.advantages import group_zscore, whiten
from grpo_jax.core.value import gae
from grpo_jax.envs import toy
from grpo_jax.policies import mlp

Array = jax.Array
Metrics = dict[str, Array]


class BanditTask(Protocol):
    """A one-step task: ``toy.DiscreteBandit`` or ``toy.ContinuousBandit``."""

    def observe(self, key: Array, batch_shape: tuple[int, ...]) -> Array: ...

    def reward(self, obs: Array, action: Array) -> Array: ...


# ==========================================================================================================
# GRPO
# ==========================================================================================================


@dataclasses.dataclass(frozen=True)
class GRPOAgentConfig:
    """GRPO on a bandit. ``kl_coef`` / ``entropy_coef`` are initial values; the state holds them as arrays."""

    num_prompts: int = 64  # B
    group_size: int = 8  # G
    num_inner_steps: int = 1  # μ: gradient steps on each batch (TRL num_iterations)
    learning_rate: float = 3e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    kl_coef: float = 0.01  # β, KL (k3) to the frozen reference
    entropy_coef: float = 0.0  # c_H, entropy bonus
    adv_ddof: int = 1
    adv_eps: float = 1e-4
    loss: PolicyLossConfig = PolicyLossConfig()

    def __post_init__(self):
        for name in ("num_prompts", "group_size", "num_inner_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"GRPOAgentConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.group_size < 2:
            raise ValueError(
                f"GRPOAgentConfig.group_size must be >= 2 (a group baseline), got {self.group_size}."
            )
        if self.adv_ddof not in (0, 1):
            raise ValueError(f"GRPOAgentConfig.adv_ddof must be 0 or 1, got {self.adv_ddof}.")


@struct.dataclass
class GRPOAgentState:
    params: dict  # policy params (trunk + actor head + log_std trained; critic head frozen)
    ref_params: dict  # π_ref: the initial params, frozen
    opt_state: optax.OptState
    kl_coef: Array  # [] float32
    entropy_coef: Array  # [] float32
    step: Array  # [] int32


def grpo_optimizer(cfg: GRPOAgentConfig) -> optax.GradientTransformation:
    """AdamW (+ global-norm clip) on trunk, actor, log_std; ``set_to_zero`` on the critic head (no state)."""
    actor_tx = optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay),
    )
    return optax.multi_transform({"actor": actor_tx, "critic": optax.set_to_zero()}, mlp.param_labels)


def grpo_init(key: Array, policy_cfg: mlp.MLPPolicyConfig, cfg: GRPOAgentConfig) -> GRPOAgentState:
    params = mlp.init_from_config(key, policy_cfg)
    return GRPOAgentState(
        params=params,
        ref_params=jax.tree.map(jnp.copy, params),  # own buffers: the state is donated
        opt_state=grpo_optimizer(cfg).init(params),
        kl_coef=jnp.asarray(cfg.kl_coef, jnp.float32),
        entropy_coef=jnp.asarray(cfg.entropy_coef, jnp.float32),
        step=jnp.zeros((), jnp.int32),
    )


def make_grpo_train_step(task: BanditTask, cfg: GRPOAgentConfig):
    """Returns the jitted ``train_step(state, key) -> (state, metrics)`` (state donated)."""
    tx = grpo_optimizer(cfg)
    B, G = cfg.num_prompts, cfg.group_size

    def train_step(state: GRPOAgentState, key: Array) -> tuple[GRPOAgentState, Metrics]:
        key = jax.random.fold_in(key, state.step)
        k_obs, k_act = jax.random.split(key)
        obs = task.observe(k_obs, (B,))  # [B, d]
        obs_g = jnp.broadcast_to(obs[:, None, :], (B, G, obs.shape[-1]))  # [B, G, d]
        actions, logp_old = mlp.dist_sample(mlp.apply(state.params, obs_g), k_act)  # [B, G](, A), [B, G]
        rewards = task.reward(obs_g, actions)  # [B, G]
        chex.assert_shape([rewards, logp_old], (B, G))
        adv = group_zscore(rewards, ddof=cfg.adv_ddof, eps=cfg.adv_eps)  # [B, G]
        logp_ref = mlp.logp(state.ref_params, obs_g, actions)[..., None]  # [B, G, 1]
        logp_old = jax.lax.stop_gradient(logp_old)[..., None]  # [B, G, 1]
        mask = jnp.ones((B, G, 1), jnp.float32)  # T = 1: one action per "completion"

        def loss_fn(params):
            out = mlp.apply(params, obs_g)
            logp = mlp.dist_logp(out, actions)[..., None]  # [B, G, 1]
            ent = mlp.dist_entropy(out)[..., None]  # [B, G, 1]
            return policy_loss(
                PolicyInputs(logp, logp_old, logp_ref, adv, mask, entropy=ent),
                cfg=cfg.loss,
                kl_coef=state.kl_coef,
                entropy_coef=state.entropy_coef,
            )

        def inner(carry, _):
            params, opt_state = carry
            (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), (aux, optax.tree.norm(grads))

        (params, opt_state), (auxs, grad_norms) = jax.lax.scan(
            inner, (state.params, state.opt_state), None, length=cfg.num_inner_steps
        )
        first = jax.tree.map(lambda x: x[0], auxs)  # diagnostics at the rollout policy
        last = jax.tree.map(lambda x: x[-1], auxs)
        group_std = jnp.std(rewards, axis=-1)  # [B]
        metrics = {
            "reward": rewards.mean(),
            "reward_std": group_std.mean(),
            "frac_reward_zero_std": (group_std == 0).mean(),
            "loss": first.loss,
            "pg_loss": first.pg_loss,
            "kl": last.kl,
            "entropy": first.entropy,
            "clip_ratio/region": last.clip_region_frac,
            "ratio_max": last.ratio_max,
            "adv_abs_mean": first.adv_abs_mean,
            "grad_norm": grad_norms.mean(),
            "kl_coef": state.kl_coef,
            "entropy_coef": state.entropy_coef,
        }
        new = dataclasses.replace(state, params=params, opt_state=opt_state, step=state.step + 1)
        return new, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    return jax.jit(train_step, donate_argnums=0)


def evaluate_bandit(params: dict, task: BanditTask, key: Array, num: int = 1024) -> Metrics:
    """Mean reward of sampled actions and of the greedy action (argmax logit / Gaussian mean) on fresh obs."""
    k_obs, k_act = jax.random.split(key)
    obs = task.observe(k_obs, (num,))
    out = mlp.apply(params, obs)
    action, _ = mlp.dist_sample(out, k_act)
    if out.logits is not None:
        greedy = jnp.argmax(out.logits, axis=-1)
    elif out.mean is not None:
        greedy = out.mean
    else:
        raise ValueError("evaluate_bandit: the policy gives neither logits nor a mean")
    return {"reward": task.reward(obs, action).mean(), "greedy_reward": task.reward(obs, greedy).mean()}


# ==========================================================================================================
# PPO
# ==========================================================================================================


@dataclasses.dataclass(frozen=True)
class PPOAgentConfig:
    """PPO on ``toy.Chain`` with the shared-trunk actor-critic."""

    num_envs: int = 64  # N episodes per rollout
    num_epochs: int = 4
    num_minibatches: int = 4  # over episodes; num_envs must be divisible
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 0.5
    gamma: float = 0.99
    lam: float = 0.95
    clip_eps: float = 0.2
    clip_eps_value: float = 0.2
    vf_coef: float = 0.5  # shared trunk: c1 of Schulman 2017 (TRL's 0.1 is for a separate value model)
    entropy_coef: float = 0.01
    whiten_advantages: bool = True

    def __post_init__(self):
        if self.num_envs % self.num_minibatches:
            raise ValueError(
                f"PPOAgentConfig.num_envs ({self.num_envs}) must be divisible by num_minibatches "
                f"({self.num_minibatches})."
            )
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(
                f"PPOAgentConfig.gamma and lam must lie in [0, 1], got {self.gamma}, {self.lam}."
            )


@struct.dataclass
class PPOAgentState:
    params: dict
    opt_state: optax.OptState
    step: Array  # [] int32


class Rollout(struct.PyTreeNode):
    obs: Array  # [N, T, d]
    action: Array  # [N, T] int32 (or [N, T, A])
    logp: Array  # [N, T]
    value: Array  # [N, T]
    reward: Array  # [N, T]
    mask: Array  # [N, T] 1.0 while the episode is alive (prefix mask)


def ppo_optimizer(cfg: PPOAgentConfig) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay),
    )


def ppo_init(key: Array, policy_cfg: mlp.MLPPolicyConfig, cfg: PPOAgentConfig) -> PPOAgentState:
    params = mlp.init_from_config(key, policy_cfg)
    return PPOAgentState(
        params=params, opt_state=ppo_optimizer(cfg).init(params), step=jnp.zeros((), jnp.int32)
    )


def chain_rollout(params: dict, env: toy.Chain, key: Array, num_envs: int) -> Rollout:
    """``num_envs`` episodes of ``env.horizon`` steps (masked after the end); arrays ``[N, T, ...]``."""
    k_reset, k_act = jax.random.split(key)
    state, obs = env.reset(k_reset, num_envs)

    def step(carry, k):
        state, obs = carry
        out = mlp.apply(params, obs)
        action, logp = mlp.dist_sample(out, k)
        alive = (~state.done).astype(jnp.float32)
        state, next_obs, reward, _ = env.step(state, action)
        rec = Rollout(obs=obs, action=action, logp=logp, value=out.value, reward=reward, mask=alive)
        return (state, next_obs), rec

    _, traj = jax.lax.scan(step, (state, obs), jax.random.split(k_act, env.horizon))  # [T, N, ...]
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj)  # [N, T, ...]


def chain_ppo_loss(params, mb, cfg: PPOAgentConfig):
    """The PPO loss of one minibatch of chain episodes: the LM's PPO loss (grpo_jax.algorithms.ppo.ppo_loss;
    clip ε both sides, masked token means as TRL's PPO) over the episode steps, and its diagnostics."""
    ro_mb, adv_mb, ret_mb = mb
    out = mlp.apply(params, ro_mb.obs)  # [n, T, ...]
    logp = mlp.dist_logp(out, ro_mb.action)
    loss_cfg = PolicyLossConfig(
        eps_low=cfg.clip_eps, eps_high=cfg.clip_eps, aggregation="token_mean", entropy_bonus="token_mean"
    )
    loss, (aux, vaux) = ppo_loss(
        logp,
        ro_mb.logp,
        None,
        out.value,
        ro_mb.value,
        adv_mb,
        ret_mb,
        ro_mb.mask,
        cfg=loss_cfg,
        vf_coef=cfg.vf_coef,
        cliprange_value=cfg.clip_eps_value,
        entropy_coef=cfg.entropy_coef,
        entropy=mlp.dist_entropy(out),
    )
    d = jax.lax.stop_gradient(logp - ro_mb.logp)
    stats = {
        "pg_loss": aux.pg_loss,
        "vf_loss": vaux.vf_loss,
        "entropy": aux.entropy,
        "clip_frac": aux.clip_region_frac,
        "vf_clip_frac": vaux.vf_clip_frac,
        "approx_kl": 0.5 * jnp.sum(d * d * ro_mb.mask) / jnp.maximum(ro_mb.mask.sum(), 1.0),  # TRL's approxkl
    }
    return loss, stats


def chain_ppo_metrics(ro, returns, auxs, grad_norms) -> Metrics:
    """One PPO step's metrics: episode return / length, the rollout-time critic's value loss and explained
    variance, the first minibatch's value loss and entropy, the last minibatch's policy diagnostics."""
    first = jax.tree.map(lambda x: x[0, 0], auxs)  # first minibatch: the rollout-time critic
    last = jax.tree.map(lambda x: x[-1, -1], auxs)
    valid = ro.mask.sum()
    resid_var = ((returns - ro.value) ** 2 * ro.mask).sum() / valid
    ret_mean = (returns * ro.mask).sum() / valid
    ret_var = ((returns - ret_mean) ** 2 * ro.mask).sum() / valid
    return {
        "episode_return": ro.reward.sum(-1).mean(),
        "episode_length": ro.mask.sum(-1).mean(),
        # 0.5·mean (V − R̂)² of the rollout-time critic on this batch (before this step's updates)
        "value_loss": 0.5 * resid_var,
        "explained_variance": 1.0 - resid_var / jnp.maximum(ret_var, 1e-8),
        "vf_loss_first_minibatch": first["vf_loss"],
        "pg_loss": last["pg_loss"],
        "entropy": first["entropy"],
        "clip_frac": last["clip_frac"],
        "vf_clip_frac": last["vf_clip_frac"],
        "approx_kl": last["approx_kl"],
        "grad_norm": grad_norms.mean(),
    }


def make_ppo_train_step(env: toy.Chain, cfg: PPOAgentConfig):
    """Returns the jitted ``train_step(state, key) -> (state, metrics)`` (state donated)."""
    tx = ppo_optimizer(cfg)
    N, M = cfg.num_envs, cfg.num_minibatches

    def train_step(state: PPOAgentState, key: Array) -> tuple[PPOAgentState, Metrics]:
        key = jax.random.fold_in(key, state.step)
        k_roll, k_perm = jax.random.split(key)
        ro = chain_rollout(state.params, env, k_roll, N)
        adv, returns = gae(ro.reward, ro.value, ro.mask, gamma=cfg.gamma, lam=cfg.lam)  # [N, T]
        adv_used = whiten(adv, ro.mask) * ro.mask if cfg.whiten_advantages else adv

        def loss_fn(params, mb):
            return chain_ppo_loss(params, mb, cfg)

        def minibatch_step(carry, mb):
            params, opt_state = carry
            (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), (aux, optax.tree.norm(grads))

        def epoch(carry, k):
            perm = jax.random.permutation(k, N)
            shuffled = jax.tree.map(
                lambda x: x[perm].reshape(M, N // M, *x.shape[1:]), (ro, adv_used, returns)
            )
            return jax.lax.scan(minibatch_step, carry, shuffled)

        (params, opt_state), (auxs, grad_norms) = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(k_perm, cfg.num_epochs)
        )
        metrics = chain_ppo_metrics(ro, returns, auxs, grad_norms)
        new = dataclasses.replace(state, params=params, opt_state=opt_state, step=state.step + 1)
        return new, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    return jax.jit(train_step, donate_argnums=0)


def evaluate_chain(params: dict, env: toy.Chain, key: Array, num: int = 1024) -> Metrics:
    """The chain's counterpart of ``evaluate_bandit``: ``num`` episodes from the same start positions with
    sampled actions (``chain_rollout``) and with the greedy action (argmax logit). Returns the mean episode
    return (= the fraction of episodes that reach the goal by the horizon) and length of each."""
    sampled = chain_rollout(params, env, key, num)
    state, obs = env.reset(jax.random.split(key)[0], num)  # chain_rollout's own reset key: the same starts

    def step(carry, _):
        state, obs = carry
        logits = mlp.apply(params, obs).logits
        if logits is None:
            raise ValueError("evaluate_chain: the policy must be discrete (the chain has 2 actions)")
        alive = (~state.done).astype(jnp.float32)
        state, next_obs, reward, _ = env.step(state, jnp.argmax(logits, axis=-1).astype(jnp.int32))
        return (state, next_obs), (reward, alive)

    _, (reward, alive) = jax.lax.scan(step, (state, obs), None, length=env.horizon)  # [T, N]
    return {
        "episode_return": sampled.reward.sum(-1).mean(),
        "episode_length": sampled.mask.sum(-1).mean(),
        "greedy_return": reward.sum(0).mean(),
        "greedy_length": alive.sum(0).mean(),
    }


def run(train_step, state: Any, key: Array, num_steps: int) -> tuple[Any, list[Metrics]]:
    """Host loop: ``num_steps`` calls of ``train_step``; returns the final state and host-side metrics."""
    history = []
    for _ in range(num_steps):
        state, metrics = train_step(state, key)
        history.append(metrics)
    return state, [jax.device_get(m) for m in history]
