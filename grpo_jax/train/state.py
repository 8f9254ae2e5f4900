"""TrainState: everything that changes from one GRPO step to the next, in one pytree.

Checkpointing this one object (plus the host-side data cursor) is enough to resume a run bit-exactly.
PRNG: the run seed is split ONCE into named streams; per step a key is `fold_in(stream, step)`, so the key
of step n never depends on how many keys earlier code drew (ARCHITECTURE.md §3 rule 5).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from grpo_jax.config import ControllerConfig, ObjectiveConfig, OptimConfig
from grpo_jax.core.controllers import Controller, make_controller

RNG_STREAMS = ("init", "sample", "data", "train", "eval")


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # [] int32, number of optimiser updates done
    params: Any
    opt_state: Any
    ref_params: Any  # None when the objective needs no reference model
    kl_ctrl: Any  # controller state; .coef is the KL coefficient β
    ent_ctrl: Any  # controller state; .coef is the entropy-bonus coefficient
    rng: dict[str, jax.Array]  # named PRNG streams (raw uint32 key data, checkpointable)
    frozen: Any = None  # frozen base parameters when `params` are LoRA adapters (None: params are the model)
    pool: Any = None  # grpo_jax.pool.PoolState of past policies (None: no pool)
    curriculum: Any = None  # grpo_jax.curriculum.CurriculumState (code-generation loop)
    replay: Any = None  # grpo_jax.replay.ReplayState of successful completions (None: no replay)
    pending: Any = None  # the next step's GRPOBatch, already graded (async rollouts only)

    def key(self, stream: str) -> jax.Array:
        """The key of `stream` for the current step."""
        return jax.random.fold_in(self.rng[stream], self.step)


def rng_streams(seed: int) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.PRNGKey(seed), len(RNG_STREAMS))
    return {name: keys[i] for i, name in enumerate(RNG_STREAMS)}


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
    """(kl controller, entropy controller): the configured one adapts, the other is constant."""
    c: ControllerConfig = obj.controller
    kl = make_controller("constant", coef=obj.kl_coef)
    ent = make_controller("constant", coef=obj.entropy_coef)
    if c.kind != "constant":
        kw = dict(c.kwargs)
        if c.acts_on == "kl_coef":
            kl = make_controller(c.kind, init_coef=obj.kl_coef, **kw)
        else:
            ent = make_controller(c.kind, init_coef=obj.entropy_coef, **kw)
    return kl, ent


def init_state(
    params: Any,
    obj: ObjectiveConfig,
    optimizer: optax.GradientTransformation,
    seed: int,
    *,
    frozen: Any = None,
    pool: Any = None,
) -> TrainState:
    """A fresh TrainState; the reference policy is a copy of the initial trainable parameters (if used).

    `params` are what the optimiser trains (the model, or LoRA adapters with the base in `frozen`)."""
    kl_ctrl, ent_ctrl = make_controllers(obj)
    ref = jax.tree.map(jnp.copy, params) if obj.uses_reference else None
    return TrainState(
        step=jnp.int32(0),
        params=params,
        opt_state=optimizer.init(params),
        ref_params=ref,
        kl_ctrl=kl_ctrl.init(),
        ent_ctrl=ent_ctrl.init(),
        rng=rng_streams(seed),
        frozen=frozen,
        pool=pool,
    )
