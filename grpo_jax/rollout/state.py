"""What the host-side rollout carries from step to step, checkpointed inside the run's RunState
(grpo_jax.train.state): per-problem counts, the curriculum, the policy pool, the replay buffer and, with
asynchronous rewards, the next step's batch already graded."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class ProblemStats:
    """Per training problem: fresh samples graded and how many passed (the pass-rate table's data)."""

    attempts: jax.Array  # [N] int32
    passes: jax.Array  # [N] int32


@flax.struct.dataclass
class RolloutState:
    stats: ProblemStats
    curriculum: Any = None  # grpo_jax.curriculum.CurriculumState
    pool: Any = None  # grpo_jax.pool.PoolState of past policies (None: no pool)
    replay: Any = None  # grpo_jax.replay.ReplayState of successful completions (None: no replay)
    pending: Any = None  # the next step's RolloutBatch, already graded (async rollouts only)
