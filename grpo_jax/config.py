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
BASELINES = ("group", "pool", "mix")
REF_UPDATES = ("frozen", "hard", "ema")
EXPLORE_MODES = ("temperature", "param_noise")
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

    baseline: "group" (canonical GRPO: the group mean, z-scored), "pool" (the seed's past-policy pool: the
        pool's mean reward on the same prompt, in the scale-only form of GRPO_MATH §3 row 4 / T1b,
        A = (r − b_pool) / (std_G(r) + eps), with `baseline_std_floor` as the scale of all-equal groups) or
        "mix" (b = baseline_mix · b_pool + (1 − baseline_mix) · mean_G(r), same scale). Prompts on which the
        pool has no returns fall back to the group mean. Pool/mix need adv_method="grpo".
    ref_update: how π_ref moves (GRPO_MATH §3 row 9): "frozen" (default), "hard" (π_ref ← π_θ every
        `ref_update_every` steps; R1 resets every 400) or "ema" (π_ref ← π_ref + τ (π_θ − π_ref) every
        `ref_update_every` steps; the seed's "target network rate 0.005" is τ = 0.005 every step, TR-DPO /
        TRL sync_ref_model is τ = 0.6 every 512).
    multiscale_w_tests: weight of the per-test sub-goal advantage added to the outcome advantage
        (grpo_jax.core.multiscale; the seed's "multi-scale advantage"); 0 = off. multiscale_mode:
        "mean_of_tests" (each test its own group advantage, averaged) or "fraction" (pass-fraction advantage).
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
    baseline: str = "group"
    baseline_mix: float = 0.5
    baseline_std_floor: float = 1.0
    ref_update: str = "frozen"
    ref_update_every: int = 1
    ref_ema_tau: float = 0.005
    multiscale_w_tests: float = 0.0
    multiscale_mode: str = "mean_of_tests"

    def __post_init__(self):
        if not self.multiscale_w_tests >= 0:
            _fail(self, "multiscale_w_tests", "must be >= 0 (0 = outcome advantage only)")
        if self.multiscale_mode not in ("mean_of_tests", "fraction"):
            _fail(self, "multiscale_mode", "valid: mean_of_tests, fraction")
        if self.baseline not in BASELINES:
            _fail(self, "baseline", f"valid: {', '.join(BASELINES)}")
        if self.baseline != "group" and self.adv_method != "grpo":
            _fail(self, "baseline", "a pool baseline uses the group-std scale: it needs adv_method='grpo'")
        if not 0 <= self.baseline_mix <= 1:
            _fail(self, "baseline_mix", "must be in [0, 1]")
        if not self.baseline_std_floor > 0:
            _fail(self, "baseline_std_floor", "must be > 0")
        if self.ref_update not in REF_UPDATES:
            _fail(self, "ref_update", f"valid: {', '.join(REF_UPDATES)}")
        if not (isinstance(self.ref_update_every, int) and self.ref_update_every >= 1):
            _fail(self, "ref_update_every", "must be an integer >= 1")
        if not 0 < self.ref_ema_tau <= 1:
            _fail(self, "ref_ema_tau", "must be in (0, 1]")
        if self.ref_update != "frozen" and not self.uses_reference:
            _fail(self, "ref_update", "moving the reference needs a KL to it (kl_coef > 0, kl_anchor='ref')")
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


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Train LoRA adapters only (Hu et al. 2021), the base model frozen; rank 0 = full fine-tuning.

    With adapters on, the TrainState's `params` are the adapters, `frozen` the base; the reference policy is
    the base without adapters (the initial adapters have B = 0), and a policy pool stores adapters only.
    """

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self):
        if not (isinstance(self.rank, int) and self.rank >= 0):
            _fail(self, "rank", "must be an integer >= 0 (0 = off)")
        if not self.alpha > 0:
            _fail(self, "alpha", "must be > 0")
        valid = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        if not self.targets or any(t not in valid for t in self.targets):
            _fail(self, "targets", f"a non-empty subset of {', '.join(valid)}")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """The seed's pool of past policies (grpo_jax.pool); capacity 0 = no pool.

    capacity: K_max, the static number of slots (ONE stacked pytree with leading axis K_max).
    k_schedule: ((step, K), ...) piecewise-constant active size (the seed: 8 -> 16 -> 32); the K most recent
        snapshots are active. Empty: K = capacity. K is data: changing it never recompiles.
    push_every: a snapshot of π_θ is pushed every N GRPO steps.
    eval_members: M slots evaluated per step (a random subset of the active ones, masked if fewer are active);
        0 = all capacity slots. samples_per_member: completions each evaluated member draws per prompt.
    explore_fraction: fraction of pushes that become exploration members (the seed: 0.2), which sample with
        `explore_temperature` ("temperature") or are stored with Gaussian parameter noise of relative size
        `explore_noise` ("param_noise", Plappert et al. 2018).
    """

    capacity: int = 0
    k_schedule: tuple[tuple[int, int], ...] = ()
    push_every: int = 10
    eval_members: int = 0
    samples_per_member: int = 1
    explore_fraction: float = 0.0
    explore_mode: str = "temperature"
    explore_temperature: float = 1.5
    explore_noise: float = 0.02

    def __post_init__(self):
        if not (isinstance(self.capacity, int) and self.capacity >= 0):
            _fail(self, "capacity", "must be an integer >= 0 (0 = no pool)")
        steps = [s for s, _ in self.k_schedule]
        if self.k_schedule and (steps[0] != 0 or steps != sorted(set(steps))):
            _fail(self, "k_schedule", "steps must start at 0 and increase strictly, e.g. ((0, 8), (100, 16))")
        if any(not 1 <= k <= max(self.capacity, 1) for _, k in self.k_schedule):
            _fail(self, "k_schedule", f"every K must be in [1, capacity={self.capacity}]")
        if self.push_every < 1:
            _fail(self, "push_every", "must be >= 1")
        if not 0 <= self.eval_members <= self.capacity:
            _fail(self, "eval_members", f"must be in [0, capacity={self.capacity}] (0 = all slots)")
        if self.samples_per_member < 1:
            _fail(self, "samples_per_member", "must be >= 1")
        if not 0 <= self.explore_fraction <= 1:
            _fail(self, "explore_fraction", "must be in [0, 1]")
        if self.explore_mode not in EXPLORE_MODES:
            _fail(self, "explore_mode", f"valid: {', '.join(EXPLORE_MODES)}")
        if not self.explore_temperature > 0:
            _fail(self, "explore_temperature", "must be > 0")
        if not self.explore_noise >= 0:
            _fail(self, "explore_noise", "must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    @property
    def members_per_step(self) -> int:
        return self.eval_members or self.capacity

    def k_at(self, step: int) -> int:
        """Active pool size at GRPO step `step` (piecewise constant; capacity without a schedule)."""
        k = self.capacity
        for s, kk in self.k_schedule:
            if step >= s:
                k = kk
        return k
