"""The run's state, split by lifecycle into one checkpointable pytree:

    RunState
      train    TrainState    what the jitted train step replaces and DONATES: step, params, optimizer state,
                             reference params, controller states, PRNG streams
      rollout  RolloutState  what the host-side rollout updates (grpo_jax.rollout): the policy pool,
                             the curriculum, the replay buffer, per-problem attempt counts, and (async
                             rollouts) the pending, already graded batch of the next step
      frozen                 read-only parameters: the LoRA base when `train.params` are adapters (else None)

`RunState` is checkpointed whole (grpo_jax.train.checkpoint); nothing is stripped and re-attached around the
train step, which takes `(state.train, batch, state.frozen)`. PRNG: `train.rng` holds the named streams of
grpo_jax.rng split once from the seed; every key is a named path below a stream (`rng.derive`), so a resumed
run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from grpo_jax import rng as rng_lib
from grpo_jax.config import ObjectiveConfig, OptimConfig
from grpo_jax.core.controllers import Controller, make_controller
from grpo_jax.rollout.state import ProblemStats, RolloutState

__all__ = ["ProblemStats", "RolloutState", "RunState", "TrainState", "init_state", "make_optimizer"]


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # [] int32, number of optimiser updates done
    params: Any  # the trainable parameters (the model, or LoRA adapters over RunState.frozen)
    opt_state: Any
    ref_params: Any  # None when the objective needs no reference model
    kl_ctrl: Any  # controller state; .coef is the KL coefficient β of the current step
    ent_ctrl: Any  # controller state; .coef is the entropy-bonus coefficient
    rng: dict[str, jax.Array]  # named PRNG streams (raw uint32 key data, checkpointable)

    def key(self, stream: str, *names: int | str | jax.Array) -> jax.Array:
        """The key of `stream` for the current step (then `names`, see grpo_jax.rng.derive)."""
        return rng_lib.derive(self.rng[stream], self.step, *names)


@flax.struct.dataclass
class RunState:
    train: TrainState
    rollout: RolloutState
    frozen: Any = None


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> AdamW (with linear warm-up), wrapped so a non-finite gradient skips the update.

    optax.apply_if_finite leaves params unchanged on a non-finite gradient and counts it
    (state.notfinite_count, state.total_notfinite), which the train step reports as metrics."""
    lr: Any = cfg.learning_rate
    if cfg.warmup_steps:
        lr = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    inner = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )
    return optax.apply_if_finite(inner, max_consecutive_errors=cfg.max_consecutive_nonfinite)


def make_controllers(obj: ObjectiveConfig) -> tuple[Controller, Controller]:
    """(KL controller, entropy controller). β: the schedule if one is set, else the configured controller
    when it drives kl_coef, else constant; the entropy coefficient likewise."""
    c = obj.controller
    if obj.kl_schedule:
        steps, values = zip(*obj.kl_schedule, strict=True)
        kl = make_controller("piecewise", boundaries=steps[1:], values=values)
    elif c.drives == "kl_coef":
        kl = make_controller(c.kind, init_coef=obj.kl_coef, **c.params())
    else:
        kl = make_controller("constant", coef=obj.kl_coef)
    if c.drives == "entropy_coef":
        ent = make_controller(c.kind, init_coef=obj.entropy_coef, **c.params())
    else:
        ent = make_controller("constant", coef=obj.entropy_coef)
    return kl, ent


def init_state(
    params: Any, obj: ObjectiveConfig, optimizer: optax.GradientTransformation, seed: int = 0
) -> TrainState:
    """A fresh TrainState over the trainable `params`; the reference is a copy of them (if the objective
    uses one). The PRNG streams are split from `seed`."""
    kl_ctrl, ent_ctrl = make_controllers(obj)
    ref = jax.tree.map(jnp.copy, params) if obj.uses_reference else None
    return TrainState(
        step=jnp.int32(0),
        params=params,
        opt_state=optimizer.init(params),
        ref_params=ref,
        kl_ctrl=kl_ctrl.init(),
        ent_ctrl=ent_ctrl.init(),
        rng=rng_lib.streams(seed),
    )
