"""The seed's actor-critic MLP (``GRPOPolicy``) as a Flax linen module plus pure functions over its params.

Architecture (seed §2.1)::

    h      = ReLU(W2 · ReLU(W1 · obs + b1) + b2) shared trunk, width ``hidden`` (seed default 1024)
    actor  = Wa · h + ba                          [..., A]  logits (discrete) or Gaussian mean (continuous)
    value  = Wc · h + bc                          [...]     critic head, a scalar per observation

Action spaces:

* ``"discrete"``: a categorical over ``act_dim`` logits; actions are int32 of shape ``[...]``.
* ``"continuous"``: a diagonal Gaussian ``N(mean(obs), diag(exp(log_std))^2)``; ``log_std`` is ONE learned,
  state-independent vector ``[A]`` (as in PPO for MuJoCo, Schulman et al. 2017), clipped to
  ``[LOG_STD_MIN, LOG_STD_MAX]`` in the forward pass (the clip stops its gradient outside that range).
  Actions are float32 ``[..., A]`` and unbounded (no tanh squashing, so ``logp`` needs no Jacobian term).

Initialisation follows the purejaxrl / CleanRL PPO convention rather than PyTorch's default ``nn.Linear``:
orthogonal weights with gain sqrt(2) in the trunk, 0.01 on the actor head (so the initial policy is close to
uniform / zero-mean, which puts a bandit at chance level) and 1.0 on the critic head; zero biases.

GRPO is critic-free (docs/GRPO_MATH.md §3 row 5): the critic head is kept so the same network serves PPO, and
``critic_mask`` / ``param_labels`` let a GRPO optimiser freeze it (no gradient, no optimiser state).

All functions take plain parameter pytrees (the ``"params"`` collection, no ``{"params": ...}`` wrapper) and
are jit/vmap-safe; the action space, ``act_dim`` and ``hidden`` are read from the parameter *shapes* and
structure (static under jit), so ``apply(params, obs)`` needs no config argument.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal, NamedTuple, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

ActionSpace = Literal["discrete", "continuous"]
LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0
_LOG_2PI = math.log(2.0 * math.pi)


@dataclasses.dataclass(frozen=True)
class MLPPolicyConfig:
    """Static description of a ``GRPOPolicy``.

    Attributes:
      obs_dim: observation size (the trunk's input width).
      act_dim: number of discrete actions, or the dimension of a continuous action.
      action_space: ``"discrete"`` (categorical) or ``"continuous"`` (diagonal Gaussian).
      hidden: trunk width; 1024 as in the seed (tests use 64).
      log_std_init: initial value of the continuous ``log_std`` vector (ignored for discrete).
    """

    obs_dim: int
    act_dim: int
    action_space: ActionSpace = "discrete"
    hidden: int = 1024
    log_std_init: float = 0.0

    def __post_init__(self):
        if self.action_space not in ("discrete", "continuous"):
            raise ValueError(f"action_space must be 'discrete' or 'continuous', got {self.action_space!r}.")
        for name in ("obs_dim", "act_dim", "hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        if self.action_space == "discrete" and self.act_dim < 2:
            raise ValueError(f"a discrete policy needs act_dim >= 2, got {self.act_dim}.")
        if not LOG_STD_MIN <= self.log_std_init <= LOG_STD_MAX:
            raise ValueError(
                f"log_std_init must lie in [{LOG_STD_MIN}, {LOG_STD_MAX}], got {self.log_std_init}."
            )


class PolicyOutput(NamedTuple):
    """One forward pass. Leading dims ``[...]`` are those of ``obs`` without its last axis.

    Exactly one of ``logits`` (discrete) or ``mean``/``log_std`` (continuous) is set; the others are None.
    """

    value: Array  # [...]      critic head
    logits: Array | None = None  # [..., A]  discrete
    mean: Array | None = None  # [..., A]  continuous
    log_std: Array | None = None  # [..., A]  continuous, clipped, broadcast to the batch


class GRPOPolicy(nn.Module):
    """Shared trunk Linear-ReLU-Linear-ReLU, actor head, critic head (seed §2.1)."""

    act_dim: int
    hidden: int = 1024
    continuous: bool = False
    log_std_init: float = 0.0

    @nn.compact
    def __call__(self, obs: Array) -> PolicyOutput:
        dense = lambda n, gain, name: nn.Dense(
            n, kernel_init=nn.initializers.orthogonal(gain), bias_init=nn.initializers.zeros, name=name
        )
        h = nn.relu(dense(self.hidden, np.sqrt(2.0), "trunk_0")(obs))
        h = nn.relu(dense(self.hidden, np.sqrt(2.0), "trunk_1")(h))
        head = dense(self.act_dim, 0.01, "actor")(h)  # [..., A]
        value = dense(1, 1.0, "critic")(h)[..., 0]  # [...]
        if not self.continuous:
            return PolicyOutput(value=value, logits=head)
        log_std = self.param("log_std", nn.initializers.constant(self.log_std_init), (self.act_dim,))
        log_std = jnp.broadcast_to(jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX), head.shape)
        return PolicyOutput(value=value, mean=head, log_std=log_std)


# ----------------------------------------------------------------------------------------------------------
# construction


def init(
    key: Array,
    obs_dim: int,
    act_dim: int,
    *,
    kind: ActionSpace = "discrete",
    hidden: int = 1024,
    log_std_init: float = 0.0,
) -> dict:
    """Initial parameters (the ``"params"`` collection) of a ``GRPOPolicy``."""
    cfg = MLPPolicyConfig(obs_dim, act_dim, kind, hidden, log_std_init)
    return init_from_config(key, cfg)


def init_from_config(key: Array, cfg: MLPPolicyConfig) -> dict:
    """Initial parameters for ``cfg`` (see ``init``). Compiled once per config (eager init is slow on CPU)."""
    return _jitted_init(cfg)(key)


@functools.lru_cache(maxsize=32)
def _jitted_init(cfg: MLPPolicyConfig):
    module = module_from_config(cfg)
    return jax.jit(lambda key: module.init(key, jnp.zeros((1, cfg.obs_dim), jnp.float32))["params"])


def module_from_config(cfg: MLPPolicyConfig) -> GRPOPolicy:
    return GRPOPolicy(
        act_dim=cfg.act_dim,
        hidden=cfg.hidden,
        continuous=cfg.action_space == "continuous",
        log_std_init=cfg.log_std_init,
    )


def is_continuous(params: dict) -> bool:
    """True iff ``params`` belong to a continuous (Gaussian) policy. Static: reads the pytree structure."""
    return "log_std" in params


def _module_from_params(params: dict) -> GRPOPolicy:
    hidden = params["trunk_0"]["kernel"].shape[-1]
    act_dim = params["actor"]["kernel"].shape[-1]
    return GRPOPolicy(act_dim=act_dim, hidden=hidden, continuous=is_continuous(params))


# ----------------------------------------------------------------------------------------------------------
# forward and distribution functions


def apply(params: dict, obs: Array) -> PolicyOutput:
    """Forward pass: ``obs`` ``[..., obs_dim]`` float -> a ``PolicyOutput`` with leading dims ``[...]``."""
    # Module.apply returns `Any | (out, variables)`; without `mutable` it is the module's own output.
    return cast(PolicyOutput, _module_from_params(params).apply({"params": params}, obs))


def _gaussian(out: PolicyOutput) -> tuple[Array, Array]:
    """``(mean, log_std)`` of a continuous forward pass; a ValueError if either is missing."""
    if out.mean is None or out.log_std is None:
        raise ValueError("PolicyOutput has neither logits nor mean/log_std")
    return out.mean, out.log_std


def dist_logp(out: PolicyOutput, action: Array) -> Array:
    """log π(a|s) from a forward pass: ``action`` int ``[...]`` or float ``[..., A]`` -> ``[...]``.

    Categorical: ``log_softmax(logits)[a]``.
    Gaussian:    ``Σ_j [ −(a_j − μ_j)² / (2σ_j²) − log σ_j − ½ log 2π ]``.
    """
    if out.logits is not None:
        logits = out.logits.astype(jnp.float32)
        logp_all = jax.nn.log_softmax(logits, axis=-1)  # [..., A]
        return jnp.take_along_axis(logp_all, action[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mean, log_std = _gaussian(out)
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * _LOG_2PI, axis=-1)


def dist_entropy(out: PolicyOutput) -> Array:
    """Entropy of π(·|s) from a forward pass, ``[...]``.

    Categorical: ``−Σ_a p_a log p_a``.  Gaussian: ``Σ_j (log σ_j + ½ log(2πe))``.
    """
    if out.logits is not None:
        logp_all = jax.nn.log_softmax(out.logits.astype(jnp.float32), axis=-1)
        return -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    _, log_std = _gaussian(out)
    return jnp.sum(log_std + 0.5 * (_LOG_2PI + 1.0), axis=-1)


def dist_sample(out: PolicyOutput, key: Array) -> tuple[Array, Array]:
    """Draw ``a ~ π(·|s)`` from a forward pass; returns ``(action, logp)``."""
    if out.logits is not None:
        action = jax.random.categorical(key, out.logits.astype(jnp.float32), axis=-1).astype(jnp.int32)
    else:
        mean, log_std = _gaussian(out)
        noise = jax.random.normal(key, mean.shape, mean.dtype)
        action = mean + jnp.exp(log_std) * noise
    return action, dist_logp(out, action)


def sample(params: dict, obs: Array, key: Array) -> tuple[Array, Array]:
    """``a ~ π_θ(·|obs)``: returns ``(action, logp)`` with ``action`` int ``[...]`` or float ``[..., A]``."""
    return dist_sample(apply(params, obs), key)


def logp(params: dict, obs: Array, action: Array) -> Array:
    """``log π_θ(action | obs)``, shape ``[...]``."""
    return dist_logp(apply(params, obs), action)


def entropy(params: dict, obs: Array) -> Array:
    """``H(π_θ(·|obs))``, shape ``[...]``."""
    return dist_entropy(apply(params, obs))


def value(params: dict, obs: Array) -> Array:
    """Critic head ``V(obs)``, shape ``[...]``."""
    return apply(params, obs).value


# ----------------------------------------------------------------------------------------------------------
# parameter partitions (for freezing the critic under GRPO)


def critic_mask(params: dict) -> dict:
    """A pytree of bools like ``params``: True on the critic head's leaves, False elsewhere."""
    return {k: jax.tree.map(lambda _, c=(k == "critic"): c, v) for k, v in params.items()}


def param_labels(params: dict) -> dict:
    """``"critic"`` on the critic head's leaves, ``"actor"`` elsewhere (trunk, actor head, log_std).

    For ``optax.multi_transform``: e.g. ``{"actor": adamw, "critic": optax.set_to_zero()}`` gives the critic
    no update and no optimiser state, as docs/GRPO_MATH.md §3 row 5 asks for GRPO.
    """
    return jax.tree.map(lambda is_critic: "critic" if is_critic else "actor", critic_mask(params))
