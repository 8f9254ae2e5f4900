"""The reward section: which reward functions the training reward combines, their weights and how
(grpo_jax.rewards; the combination is grpo_jax.core.advantages.multi_reward_advantages)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.config.base import Mechanism, _check_sub_settings, _choice, opt
from grpo_jax.errors import fail
from grpo_jax.rewards import spec


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """`--rewards=tests:1.0,format:0.1`: built-in rewards (grpo_jax.rewards.spec.BUILTIN) or a user's
    `module:function`, each with a weight; the default, `tests`, is the sandbox's test result alone."""

    FLAG_PREFIX: ClassVar[str] = "reward_"
    functions: str = opt(
        spec.DEFAULT,
        "The training reward's functions and weights, NAME[:WEIGHT],...: built-in "
        f"({', '.join(spec.BUILTIN)}) or a user's module:function called as "
        "f(problem, reply, program, grade) -> float on plain data (docs/REWARDS.md).",
        flag="rewards",
    )
    aggregation: str = opt(
        "sum_then_normalize",
        "How several rewards make the training reward: sum_then_normalize (Σ w_k r_k, then the group "
        "advantage) or normalize_then_sum (GDPO: each reward normalised in its group, weighted sum, "
        "normalised over the batch; needs --adv_method=batch_std).",
        choices=spec.AGGREGATIONS,
    )
    length_cache: int = opt(
        0,
        "L_cache of the `length` reward: replies longer than L_max - L_cache tokens are penalised linearly "
        "down to -1 at L_max = max_new_tokens x max_turns (0 = a quarter of L_max).",
    )

    def __post_init__(self):
        try:
            spec.parse(self.functions)
        except spec.SpecError as e:
            fail(self, "functions", str(e))
        _choice(self, "aggregation", spec.AGGREGATIONS)
        if self.length_cache < 0:
            fail(self, "length_cache", "must be >= 0 (0 = a quarter of L_max)")
        _check_sub_settings(self, "rewards", SUB_SETTINGS)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in spec.parse(self.functions))

    @property
    def default(self) -> bool:
        """Today's training reward alone (tests, weight 1, summed)."""
        return spec.is_default(self.functions) and self.aggregation == "sum_then_normalize"

    def cache_len(self, max_len: int) -> int:
        """The `length` reward's L_cache for completions of at most `max_len` model tokens."""
        return self.length_cache or max(1, max_len // 4)


SUB_SETTINGS: tuple[Mechanism, ...] = (
    Mechanism(
        "length_reward",
        "rewards",
        "--rewards=...,length:W",
        "the length reward's penalty window",
        lambda r: "length" in r.names,
        lambda r: f"--rewards={r.functions}",
        ("length_cache",),
    ),
)
