"""The ONE configuration of a run: a tree of frozen, validated dataclasses (ARCHITECTURE.md §3 rule 9).

    RunConfig
      model       ModelConfig        the transformer's shape (the vocabulary comes from the tokenizer)
      tasks       TaskConfig         which levels of the procedural suite train / evaluate, prompt length
      sft         SFTConfig          the supervised warm start
      objective   ObjectiveConfig    the algorithm (grpo | ppo | dppo), advantages, baseline, KL, entropy,
                                     reference updates, reward shaping
        ppo         PPOConfig        --algorithm=ppo: GAE, the critic's value loss, whitening, the reward's KL
        dppo        DPPOConfig       --algorithm=dppo: the trust region's thresholds and divergence
        loss        PolicyLossConfig clipping, KL estimator/anchor, aggregation, TIS (every algorithm's loss)
        controller  ControllerConfig adaptive entropy / KL coefficient
      rewards     RewardConfig       the training reward's functions, weights and aggregation
      optim       OptimConfig        AdamW
      rollout     RolloutConfig      B, G, sampling, dynamic sampling, async rewards
      pool        PoolConfig         the seed's pool of past policies
      lora        LoRAConfig         adapters-only training
      replay      ReplayConfig       prioritized replay of successes
      curriculum  CurriculumConfig   problem sampling by level / pass rate
      eval        EvalConfig         held-out pass@k
      sandbox     SandboxConfig      the code executor's workers and limits
      checkpoint  CheckpointConfig   orbax checkpoints
      log         LogConfig          console / TensorBoard / JSONL cadence
      mesh        MeshConfig         the device mesh: data x fsdp x tensor
      dist        DistConfig         multi-process / multi-host (jax.distributed)
      runtime     RuntimeConfig      how this process runs (the persistent compilation cache)

The package, one module per part of the tree, each section beside its mechanisms and checks:

    base.py           opt (a field with its flag's help), the shared checks, get_path, Mechanism (the
                      sub-settings rule)
    model.py          ModelConfig, LoRAConfig
    tasks.py          TaskConfig, SFTConfig (the problems, their prompts, the warm start)
    objective.py      ObjectiveConfig (its algorithm sections come from algorithms/)
    loss.py           PolicyLossConfig
    controller.py     ControllerConfig, CONTROLLER_PARAMS
    algorithms/       one module per --algorithm: its section, checks and registration (registry.py)
    optim.py          OptimConfig
    rewards.py        RewardConfig (the --rewards syntax is grpo_jax.rewards.spec's)
    rollout.py        RolloutConfig, PoolConfig, ReplayConfig, CurriculumConfig
    runtime.py        EvalConfig, SandboxConfig, CheckpointConfig, LogConfig, MeshConfig, RuntimeConfig,
                      DistConfig
    run.py            RunConfig (the cross-section rules, the derived fields), SUB_SETTINGS, SECTIONS
    serialization.py  leaves / from_leaves / flat_dict, field_types
    migration.py      saved configs: migrate_saved, RESUMABLE_CHANGES, SFT_INPUTS

Every field is checked once, in the `__post_init__` of the class that owns it (cross-section rules in
`RunConfig.__post_init__`), and a bad value raises grpo_jax.errors.ConfigError naming the field, the value and
what is valid. The command line is DERIVED from this tree (grpo_jax.cli): each leaf field is one flag, named
`FLAG_PREFIX + field` unless its metadata names the flag, with the field's `help` metadata as its help text;
so a flag's default, type, meaning and check are written once, here. Everything in the tree is hashable (a
static jit argument); numbers that change during training (coefficients, the schedule position) are arrays
in the TrainState.

Derived quantities are computed in one place, `RunConfig._derive` (the loss's max_len = max_new_tokens, and
the defaults that depend on the model, AUTO_DEFAULTS: a pretrained --init_from model gets no SFT and chat
prompts unless told otherwise). A setting of an optional mechanism that is off (SUB_SETTINGS: --pool_capacity
without a pool baseline, --ppo_* without --algorithm=ppo, ...) is refused by one rule, `Mechanism`.
"""

from __future__ import annotations

from grpo_jax.config.algorithms.dppo import DPPOConfig
from grpo_jax.config.algorithms.ppo import PPOConfig
from grpo_jax.config.base import Mechanism, get_path, opt
from grpo_jax.config.controller import CONTROLLER_PARAMS, ControllerConfig
from grpo_jax.config.loss import ENTROPY_BONUS, PolicyLossConfig
from grpo_jax.config.migration import (
    RESUMABLE_CHANGES,
    SFT_INPUTS,
    SFT_INPUTS_EXCLUDED,
    is_sft_input,
    migrate_saved,
)
from grpo_jax.config.model import DTYPES, LoRAConfig, ModelConfig
from grpo_jax.config.objective import ALGORITHMS, BASELINES, MULTISCALE_MODES, REF_UPDATES, ObjectiveConfig
from grpo_jax.config.optim import OptimConfig
from grpo_jax.config.rewards import RewardConfig
from grpo_jax.config.rollout import (
    CURRICULUM_KINDS,
    EXPLORE_MODES,
    CurriculumConfig,
    PoolConfig,
    ReplayConfig,
    RolloutConfig,
)
from grpo_jax.config.run import AUTO_DEFAULTS, SECTIONS, SUB_SETTINGS, RunConfig
from grpo_jax.config.runtime import (
    DIST_CLUSTERS,
    TIME_LIMITS,
    CheckpointConfig,
    DistConfig,
    EvalConfig,
    LogConfig,
    MeshConfig,
    RuntimeConfig,
    SandboxConfig,
)
from grpo_jax.config.serialization import _defaults, field_types, flat_dict, from_leaves, is_section, leaves
from grpo_jax.config.tasks import (
    DATA_FORMATS,
    GRADE_TESTS,
    PROMPT_FORMATS,
    TASK_SOURCES,
    SFTConfig,
    TaskConfig,
)

__all__ = [
    "ALGORITHMS",
    "AUTO_DEFAULTS",
    "BASELINES",
    "CONTROLLER_PARAMS",
    "CURRICULUM_KINDS",
    "DATA_FORMATS",
    "DIST_CLUSTERS",
    "DTYPES",
    "ENTROPY_BONUS",
    "EXPLORE_MODES",
    "GRADE_TESTS",
    "MULTISCALE_MODES",
    "PROMPT_FORMATS",
    "REF_UPDATES",
    "RESUMABLE_CHANGES",
    "SECTIONS",
    "SFT_INPUTS",
    "SFT_INPUTS_EXCLUDED",
    "SUB_SETTINGS",
    "TASK_SOURCES",
    "TIME_LIMITS",
    "CheckpointConfig",
    "ControllerConfig",
    "CurriculumConfig",
    "DPPOConfig",
    "DistConfig",
    "EvalConfig",
    "LoRAConfig",
    "LogConfig",
    "Mechanism",
    "MeshConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "OptimConfig",
    "PPOConfig",
    "PolicyLossConfig",
    "PoolConfig",
    "ReplayConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "RuntimeConfig",
    "SFTConfig",
    "SandboxConfig",
    "TaskConfig",
    "_defaults",
    "field_types",
    "flat_dict",
    "from_leaves",
    "get_path",
    "is_section",
    "is_sft_input",
    "leaves",
    "migrate_saved",
    "opt",
]
