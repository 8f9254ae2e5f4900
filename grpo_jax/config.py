"""Frozen, validated configuration dataclasses for the GRPO trainer.

Everything here is hashable, so a config can be a static argument of `jax.jit`; numbers that change during
training (KL / entropy coefficients, learning rate) live in the TrainState as arrays instead. Each dataclass
validates itself in `__post_init__` and raises one ValueError naming the field and the valid values.
"""

from __future__ import annotations

import dataclasses

from grpo_jax.core.controllers import CONTROLLER_KINDS
from grpo_jax.core.losses import GRPOLossConfig

ADV_METHODS = ("grpo", "dr_grpo", "rloo", "batch_std")
ENTROPY_CONTROLLERS = ("seed_entropy", "skywork_entropy")
KL_CONTROLLERS = ("ppo_adaptive_kl", "ziegler_kl")


def _fail(obj, field, why):
    raise ValueError(f"{type(obj).__name__}.{field}={getattr(obj, field)!r}: {why}")


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """An adaptive coefficient controller (grpo_jax.core.controllers) and the coefficient it drives.

    kind: constant | seed_entropy | skywork_entropy | ppo_adaptive_kl | ziegler_kl. Entropy controllers
    measure the policy entropy, KL controllers the KL estimate. acts_on: "entropy_coef" (default; the
    coherent choice, GRPO_MATH §3 row 11) or "kl_coef" (the seed document's literal reading, experimental).
    kwargs: extra factory arguments as a tuple of (name, value) pairs (hashable), e.g. (("target", 2.0),).
    """

    kind: str = "constant"
    acts_on: str = "entropy_coef"
    kwargs: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        if self.kind not in CONTROLLER_KINDS:
            _fail(self, "kind", f"valid: {', '.join(CONTROLLER_KINDS)}")
        if self.acts_on not in ("entropy_coef", "kl_coef"):
            _fail(self, "acts_on", "valid: entropy_coef, kl_coef")

    @property
    def measures(self) -> str:
        return "kl" if self.kind in KL_CONTROLLERS else "entropy"


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """The GRPO objective: advantages, loss and coefficients (see grpo_jax.core.presets for named presets).

    kl_coef: β of the KL to the reference policy (initial value if a controller drives it); 0 disables the
    reference model entirely (TRL's default). entropy_coef: weight of the entropy bonus.
    mask_truncated: drop completions that hit max_new_tokens without EOS from the loss (DAPO overlong filter).
    num_iterations: μ, optimiser steps per rollout batch (μ > 1 makes π_θ differ from π_old after the first).
    success_threshold: a sample counts as a success (Performance/SuccessRate) when reward >= this.
    """

    adv_method: str = "grpo"
    adv_ddof: int = 1
    adv_eps: float = 1e-4
    loss: GRPOLossConfig = GRPOLossConfig()
    kl_coef: float = 0.04
    entropy_coef: float = 0.0
    controller: ControllerConfig = ControllerConfig()
    mask_truncated: bool = False
    num_iterations: int = 1
    success_threshold: float = 1.0

    def __post_init__(self):
        if self.adv_method not in ADV_METHODS:
            _fail(self, "adv_method", f"valid: {', '.join(ADV_METHODS)}")
        if self.adv_ddof not in (0, 1):
            _fail(self, "adv_ddof", "valid: 0 or 1")
        if not self.adv_eps >= 0:
            _fail(self, "adv_eps", "must be >= 0")
        if not self.kl_coef >= 0:
            _fail(self, "kl_coef", "must be >= 0")
        if not self.entropy_coef >= 0:
            _fail(self, "entropy_coef", "must be >= 0")
        if not (isinstance(self.num_iterations, int) and self.num_iterations >= 1):
            _fail(self, "num_iterations", "must be an integer >= 1")

    @property
    def uses_reference(self) -> bool:
        """Whether a reference model is needed (KL anchored at π_ref with a coefficient that can be > 0)."""
        adaptive_kl = self.controller.acts_on == "kl_coef" and self.controller.kind != "constant"
        return self.loss.kl_anchor == "ref" and (self.kl_coef > 0 or adaptive_kl)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with global-norm gradient clipping and linear warm-up; non-finite updates are skipped."""

    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    warmup_steps: int = 0
    max_consecutive_nonfinite: int = 1000

    def __post_init__(self):
        if not self.learning_rate > 0:
            _fail(self, "learning_rate", "must be > 0")
        if not self.weight_decay >= 0:
            _fail(self, "weight_decay", "must be >= 0")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            _fail(self, "b1", "b1 and b2 must be in [0, 1)")
        if not self.grad_clip > 0:
            _fail(self, "grad_clip", "must be > 0")
        if not self.warmup_steps >= 0:
            _fail(self, "warmup_steps", "must be >= 0")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How completions are sampled: G per prompt, up to max_new_tokens, with these sampling parameters."""

    group_size: int = 8
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.group_size >= 2:
            _fail(self, "group_size", "must be >= 2 (group-relative advantages need a group)")
        if not self.max_new_tokens >= 1:
            _fail(self, "max_new_tokens", "must be >= 1")
        if not self.temperature > 0:
            _fail(self, "temperature", "must be > 0 for training rollouts (greedy is for evaluation)")
        if not self.top_k >= 0:
            _fail(self, "top_k", "must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            _fail(self, "top_p", "must be in (0, 1]")
