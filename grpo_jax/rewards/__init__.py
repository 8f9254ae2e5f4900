"""Rewards as researchers compose them (numpy only, no JAX): named reward functions, weighted, from the
command line.

    --rewards=tests:1.0,format:0.1 --reward_aggregation=sum_then_normalize|normalize_then_sum
    --rewards=tests,mypkg.rewards:style:0.2          a user's function by import path

    spec.py      the --rewards syntax and the built-in names (the config checks values with it)
    types.py     what a reward function is given: RewardProblem, Grade, Sample (plain data only)
    builtin.py   tests, tests_fraction, format, lint, length
    static.py    ruff on program text in a subprocess (format, lint): nothing is imported or executed
    registry.py  resolve(--rewards) -> RewardSet (user functions imported and checked), RewardError
    metrics.py   each reward's mean, std and share of the advantage

The combination into the training reward (grpo_jax.core.advantages.multi_reward_advantages) is the grader's
(grpo_jax.rollout.grader); the per-sample rewards are computed where the verdicts are (each process its own
rows).
"""

from grpo_jax.rewards.registry import RewardError, RewardSet, resolve
from grpo_jax.rewards.spec import AGGREGATIONS, BUILTIN

__all__ = ["AGGREGATIONS", "BUILTIN", "RewardError", "RewardSet", "resolve"]
