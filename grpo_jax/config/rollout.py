"""How a step's batch is made: the rollout (B prompts x G completions, sampling, the engine, multi-turn), the
policy pool of the pool baseline, prioritized replay and the curriculum that draws the problems."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.config.base import Mechanism, _check_sub_settings, _choice, _positive, _schedule_ok, opt
from grpo_jax.errors import fail
from grpo_jax.policies.continuous import ROLLOUT_ENGINES
from grpo_jax.policies.sampling import ROLLOUT_DTYPES

EXPLORE_MODES = ("temperature", "param_noise")
CURRICULUM_KINDS = ("uniform", "levels", "pass_rate", "levels+pass_rate")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How a step's batch is made: B prompts, G completions each, sampling, refills, async grading."""

    FLAG_PREFIX: ClassVar[str] = ""
    prompts_per_step: int = opt(8, "Prompts per GRPO step (B).")
    group_size: int = opt(8, "Completions per prompt (G).")
    max_new_tokens: int = opt(
        24, "Completion length in tokens (also the SFT target length and Dr. GRPO's L)."
    )
    temperature: float = opt(1.0, "Sampling temperature of training rollouts.")
    top_k: int = opt(
        0,
        "Top-k of training rollouts (0 = off). The sampler's behaviour log-probs are those of the truncated, "
        "renormalised distribution it draws from, so --tis_cap corrects for the truncation (without it the "
        "truncation bias is uncorrected); the trainer's π_θ is the untruncated softmax(logits / "
        "temperature), and logp_mismatch includes the gap −log(kept mass).",
    )
    top_p: float = opt(
        1.0,
        "Top-p of training rollouts (1 = off; the nucleus is taken under softmax(logits / temperature)). As "
        "with --top_k, the behaviour log-probs are the truncated distribution's: --tis_cap corrects for it.",
    )
    rollout_dtype: str = opt(
        "float32",
        "Weights and compute dtype of the training rollouts' sampler. float32: the policy's own numerics "
        "(the sampler's log-probs equal the trainer's to rounding). bfloat16: the weights are cast once per "
        "rollout and decoding reads half the bytes (faster where decoding is bound by memory); the behaviour "
        "policy then differs from the trained policy by bf16 rounding, as an inference engine's rollouts do: "
        "logp_mismatch measures it and --tis_cap corrects for it. Evaluation samples the policy as it is "
        "(--compute_dtype: a bfloat16 policy from its bf16 weight copy), never in the rollout dtype.",
        choices=ROLLOUT_DTYPES,
    )
    engine: str = opt(
        "static",
        "The rollout engine of training, evaluation and multi-turn alike (grpo_jax.rollout.engines). static: "
        "one compiled batch of all B x G rows that decodes until its longest reply ends. continuous: "
        "continuous batching, --engine_slots decode slots refilled from the queue of samples as replies "
        "end, the running slots moved into smaller batches once nothing is pending (for replies whose "
        "lengths spread widely; a sample's tokens depend on its own key only). Measured figures and when "
        "to use which: docs/ROLLOUT_ENGINES.md.",
        flag="rollout_engine",
        choices=ROLLOUT_ENGINES,
    )
    engine_slots: int = opt(
        32, "With --rollout_engine=continuous: the most decode slots (samples decoded at once)."
    )
    engine_chunk: int = opt(
        16,
        "With --rollout_engine=continuous: decode steps per device call, between which ended samples' slots "
        "are refilled (a slot whose reply ends idles for the rest of the chunk).",
    )
    dynamic_sampling: bool = opt(False, "DAPO dynamic sampling: refill groups whose rewards are all equal.")
    dynamic_max_rounds: int = opt(3, "Extra sampling rounds per step for dynamic sampling.")
    async_rewards: bool = opt(
        False,
        "Sample and grade step t+1 while the device trains on step t (one step off-policy; needs --tis_cap).",
    )
    max_turns: int = opt(
        1,
        "Turns per trajectory (multi-turn execution feedback; 1 = one program per sample). After a failed "
        "turn the model sees what its program did on the problem's VISIBLE tests (grpo_jax.codegen.feedback) "
        "and writes the program again, until a turn passes or max_turns are used; the reward is the last "
        "turn's and the loss covers the model's tokens of every turn.",
    )
    feedback_tokens: int = opt(
        128, "The most tokens of one feedback turn (with --max_turns > 1; the message is cut to fit)."
    )
    turn_discount: float = opt(
        1.0,
        "With --max_turns > 1: the reward of a trajectory that ends at turn t is multiplied by "
        "turn_discount^(t-1) (1 = no discount; < 1 prefers passing early).",
    )

    @property
    def completion_len(self) -> int:
        """T of the batch: every turn's reply and every feedback turn between them."""
        return self.max_turns * self.max_new_tokens + (self.max_turns - 1) * self.feedback_tokens

    def __post_init__(self):
        _positive(self, ("prompts_per_step", "max_new_tokens", "temperature", "max_turns", "feedback_tokens"))
        if not 0 < self.turn_discount <= 1:
            fail(self, "turn_discount", "must be in (0, 1]")
        if self.group_size < 2:
            fail(self, "group_size", "must be >= 2 (group-relative advantages need a group)")
        _positive(self, ("top_k", "dynamic_max_rounds"), strict=False)
        if not 0 < self.top_p <= 1:
            fail(self, "top_p", "must be in (0, 1]")
        _choice(self, "rollout_dtype", ROLLOUT_DTYPES)
        _choice(self, "engine", ROLLOUT_ENGINES)
        _positive(self, ("engine_slots", "engine_chunk"))
        _check_sub_settings(self, "rollout", SUB_SETTINGS)


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """The seed's pool of past policies (grpo_jax.pool): ONE stacked pytree with leading axis `capacity`.

    The K most recent snapshots are active (K from `k_schedule`, data: never recompiles); `eval_members` of
    them sample `samples_per_member` completions of the step's prompts; their mean reward is b_pool(q).
    """

    FLAG_PREFIX: ClassVar[str] = "pool_"
    capacity: int = opt(
        0,
        "Past-policy pool slots K_max (0 = no pool). Only with --baseline=pool|mix: nothing else samples the "
        "members.",
    )
    k_schedule: tuple[tuple[int, int], ...] = opt(
        (),
        "Active pool size by GRPO step, 'step:K,...' from step 0 (e.g. 0:8,100:16,500:32); empty = capacity.",
    )
    push_every: int = opt(10, "Push a snapshot of the policy into the pool every N GRPO steps.")
    eval_members: int = opt(0, "Pool members evaluated per step (0 = all slots).")
    samples_per_member: int = opt(1, "Completions per prompt each evaluated member draws.")
    explore_fraction: float = opt(0.0, "Fraction of pushes made exploration members (the seed: 0.2).")
    explore_mode: str = opt(
        "temperature", "How exploration members explore: temperature or param_noise.", choices=EXPLORE_MODES
    )
    explore_temperature: float = opt(1.5, "Sampling temperature of exploration members.")
    explore_noise: float = opt(
        0.2,
        "Relative parameter-noise scale σ of exploration members (each leaf + σ·RMS(leaf)·N(0, 1)). The "
        "default moves a member's samples about as far as one push period of GRPO drift does; how it was "
        "chosen: docs/GRPO_MATH.md §1.12.",
    )

    def __post_init__(self):
        _positive(self, ("capacity", "explore_noise"), strict=False)
        _schedule_ok(self, "k_schedule", "0:8,100:16")
        if any(not 1 <= k <= max(self.capacity, 1) for _, k in self.k_schedule):
            fail(self, "k_schedule", f"every K must be in [1, capacity={self.capacity}]")
        _positive(self, ("push_every", "samples_per_member", "explore_temperature"))
        if not 0 <= self.eval_members <= self.capacity:
            fail(self, "eval_members", f"must be in [0, capacity={self.capacity}] (0 = all slots)")
        if not 0 <= self.explore_fraction <= 1:
            fail(self, "explore_fraction", "must be in [0, 1]")
        _choice(self, "explore_mode", EXPLORE_MODES)
        _check_sub_settings(self, "pool", SUB_SETTINGS)

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


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """Prioritized replay of successes (grpo_jax.replay): for `fraction`·B prompts the G-th member is a
    stored success of a rarely solved problem, priority (1 − s(q) + 0.01)^alpha (off-policy: --tis_cap)."""

    FLAG_PREFIX: ClassVar[str] = "replay_"
    fraction: float = opt(0.0, "Fraction of prompts whose G-th member is a replayed success (0 = off).")
    capacity: int = opt(1024, "Replay buffer capacity.")
    alpha: float = opt(1.0, "Replay priority exponent: (1 - s(q) + 0.01) ** alpha.")

    def __post_init__(self):
        if not 0 <= self.fraction < 1:
            fail(self, "fraction", "must be in [0, 1)")
        _positive(self, ("capacity",))
        _positive(self, ("alpha",), strict=False)
        _check_sub_settings(self, "replay", SUB_SETTINGS)

    @property
    def enabled(self) -> bool:
        return self.fraction > 0


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """Curriculum hyper-parameters (grpo_jax.curriculum has the rules; hashable: a static jit argument).

    kind: uniform | levels | pass_rate | levels+pass_rate; P(q) ∝ [level unlocked] · max(1 − s(q), floor).
    """

    FLAG_PREFIX: ClassVar[str] = "curriculum_"
    kind: str = opt(
        "uniform",
        "Problem sampling: uniform, levels (unlock by pass-rate thresholds), pass_rate "
        "(P(q) ~ max(1 - s(q), floor), Kimi k1.5) or levels+pass_rate.",
        flag="curriculum",
        choices=CURRICULUM_KINDS,
    )
    ema: float = opt(0.9, "EMA factor of the per-problem / per-level pass rates, in [0, 1).")
    floor: float = opt(0.05, "Floor of 1 - s(q) in the pass-rate sampling weights, in (0, 1].")
    prior: float = opt(0.0, "s(q) of a never-attempted problem (and the initial level rates), in [0, 1].")
    start_level: int = opt(0, "Highest unlocked level at the start (an index into --rl_levels).")
    promote: float = opt(0.6, "Unlock the next level when the top level's pass rate >= this.")
    demote: float = opt(0.1, "Lock the top level again when its pass rate < this.")
    min_attempts: int = opt(32, "Samples on a level before it may be promoted / demoted.")

    def __post_init__(self):
        _choice(self, "kind", CURRICULUM_KINDS)
        if not 0.0 <= self.ema < 1.0:
            fail(self, "ema", "valid: 0 <= ema < 1")
        if not 0.0 < self.floor <= 1.0:
            fail(self, "floor", "valid: 0 < floor <= 1")
        if not 0.0 <= self.prior <= 1.0:
            fail(self, "prior", "valid: 0 <= prior <= 1")
        if self.start_level < 0:
            fail(self, "start_level", "valid: an integer >= 0 (and < the number of levels)")
        if not 0.0 < self.promote <= 1.0:
            fail(self, "promote", "valid: 0 < promote <= 1 (and > demote)")
        if not 0.0 <= self.demote < self.promote:
            fail(self, "demote", f"valid: 0 <= demote < promote={self.promote}")
        if self.min_attempts < 1:
            fail(self, "min_attempts", "valid: an integer >= 1")

    @property
    def uses_levels(self) -> bool:
        return self.kind in ("levels", "levels+pass_rate")

    @property
    def uses_pass_rate(self) -> bool:
        return self.kind in ("pass_rate", "levels+pass_rate")


# the sub-settings of these sections' optional mechanisms (base.Mechanism: one rule); those of scope "" read
# other sections' switches and are checked by RunConfig
SUB_SETTINGS: tuple[Mechanism, ...] = (
    Mechanism(
        "dynamic_sampling",
        "rollout",
        "--dynamic_sampling",
        "DAPO's dynamic sampling",
        lambda r: r.dynamic_sampling,
        lambda r: "--nodynamic_sampling",
        ("dynamic_max_rounds",),
    ),
    Mechanism(
        "pool_baseline",
        "",
        "--baseline=pool|mix",
        "a pool baseline: nothing else samples the pool's members; with --baseline=group a pool only stores "
        "snapshots and logs pool/size and pool/diversity",
        lambda c: c.objective.baseline != "group",
        lambda c: f"--baseline={c.objective.baseline}",
        (
            "pool.k_schedule",
            "pool.push_every",
            "pool.eval_members",
            "pool.samples_per_member",
            "pool.explore_fraction",
            "pool.capacity",
        ),
    ),
    Mechanism(
        "exploration",
        "pool",
        "--pool_explore_fraction > 0",
        "exploration members",
        lambda p: p.explore_fraction > 0,
        lambda p: f"--pool_explore_fraction={p.explore_fraction}",
        ("explore_mode",),
    ),
    Mechanism(
        "explore_temperature",
        "pool",
        "--pool_explore_fraction > 0 and --pool_explore_mode=temperature",
        "exploration members that sample hotter",
        lambda p: p.explore_fraction > 0 and p.explore_mode == "temperature",
        lambda p: f"--pool_explore_fraction={p.explore_fraction} --pool_explore_mode={p.explore_mode}",
        ("explore_temperature",),
    ),
    Mechanism(
        "explore_noise",
        "pool",
        "--pool_explore_fraction > 0 and --pool_explore_mode=param_noise",
        "exploration members with parameter noise",
        lambda p: p.explore_fraction > 0 and p.explore_mode == "param_noise",
        lambda p: f"--pool_explore_fraction={p.explore_fraction} --pool_explore_mode={p.explore_mode}",
        ("explore_noise",),
    ),
    Mechanism(
        "replay",
        "replay",
        "--replay_fraction > 0",
        "prioritized replay",
        lambda r: r.fraction > 0,
        lambda r: f"--replay_fraction={r.fraction}",
        ("capacity", "alpha"),
    ),
    Mechanism(
        "pass_rate_estimates",
        "",
        "a --curriculum other than uniform, or --replay_fraction > 0",
        "the pass-rate estimates s(q) that a curriculum samples by and replay prioritises by",
        lambda c: c.curriculum.kind != "uniform" or c.replay.enabled,
        lambda c: "--curriculum=uniform and no replay",
        ("curriculum.ema", "curriculum.prior"),
    ),
    Mechanism(
        "pass_rate_curriculum",
        "",
        "--curriculum=pass_rate|levels+pass_rate",
        "sampling by pass rate, P(q) ∝ max(1 − s(q), floor)",
        lambda c: c.curriculum.uses_pass_rate,
        lambda c: f"--curriculum={c.curriculum.kind}",
        ("curriculum.floor",),
    ),
    Mechanism(
        "level_curriculum",
        "",
        "--curriculum=levels|levels+pass_rate",
        "level unlocking",
        lambda c: c.curriculum.uses_levels,
        lambda c: f"--curriculum={c.curriculum.kind}",
        ("curriculum.start_level", "curriculum.promote", "curriculum.demote", "curriculum.min_attempts"),
    ),
)
