"""The device side learns: GRPO with the transformer policy on the synthetic counting task.

Chance is 1/14 per token; the test asserts the mean reward rises from near chance to near its maximum (1.0).
About a minute of CPU (the same run as `python -m experiments.token_task`).
"""

import numpy as np

from grpo_jax.config import ObjectiveConfig, OptimConfig
from grpo_jax.train import token_loop as tt


def test_grpo_transformer_learns_token_task():
    task = tt.TokenTaskConfig(steps=150, prompts_per_step=16, seed=0)
    _, hist = tt.run(task, obj=ObjectiveConfig(kl_coef=0.04), optim=OptimConfig(learning_rate=1e-3))
    rewards = np.array([h["reward"] for h in hist])
    first, last = rewards[:5].mean(), rewards[-10:].mean()
    assert first < 0.15, first  # chance level is 1/14 = 0.071
    assert last > 0.85, (first, last)
    assert hist[-1]["kl"] > 0  # the policy moved away from the reference and the KL term saw it
