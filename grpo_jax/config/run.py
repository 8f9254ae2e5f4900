"""The run: RunConfig, the root of the tree, with the rules across sections and the derived fields; the
whole sub-settings table (SUB_SETTINGS) and the list of sections (SECTIONS)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

from grpo_jax.config import controller, loss, model, objective, rewards, rollout, tasks
from grpo_jax.config import runtime as rt
from grpo_jax.config.algorithms import spec as algorithm_spec
from grpo_jax.config.algorithms import specs as algorithm_specs
from grpo_jax.config.base import Mechanism, _check_sub_settings, _field_default, _positive, get_path, opt
from grpo_jax.config.controller import ControllerConfig
from grpo_jax.config.loss import PolicyLossConfig
from grpo_jax.config.model import LoRAConfig, ModelConfig
from grpo_jax.config.objective import ObjectiveConfig
from grpo_jax.config.optim import OptimConfig
from grpo_jax.config.rewards import RewardConfig
from grpo_jax.config.rollout import CurriculumConfig, PoolConfig, ReplayConfig, RolloutConfig
from grpo_jax.config.tasks import SFTConfig, TaskConfig
from grpo_jax.errors import fail

# defaults that depend on the model, resolved by RunConfig._derive (an explicit value always wins): {path:
# (the value for a model trained from scratch, the value for a pretrained --init_from model)}. Unresolved,
# the field holds None (sft.steps) or "auto" (tasks.prompt_format); a built RunConfig never does, so a config
# derived from a built one (dataclasses.replace, from_leaves of its leaves) keeps the resolved values: give
# these fields again when changing init_from that way.
AUTO_DEFAULTS: dict[str, tuple[Any, Any]] = {"sft.steps": (300, 0), "tasks.prompt_format": ("plain", "chat")}
# what only matters when SFT runs: refused next to a pretrained model's no-SFT default (RunConfig)
_SFT_SETTINGS = ("sft.batch", "sft.lr", "sft.warmup_steps", "sft.bucket", "tasks.sft_levels")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The whole run of `python -m experiments.codegen` (grpo_jax.train.loop.run)."""

    FLAG_PREFIX: ClassVar[str] = ""
    workdir: str = opt("", "Run directory: checkpoints, TensorBoard events, metrics.jsonl, results.json.")
    seed: int = opt(0, "Seed of the task suite, the model init and every PRNG stream.")
    resume: bool = opt(
        True,
        "Resume from the workdir's newest intact checkpoint if there is one (a corrupt newer step, whose "
        "files differ from the checksums recorded when it was saved, is reported and skipped).",
    )
    resume_from: int | None = opt(
        None,
        "Resume from this checkpoint step of the workdir (none = the newest intact one); a step that is not "
        "there or is corrupt is an error listing the intact steps.",
    )
    steps: int = opt(50, "GRPO steps.")
    preset: str = opt(
        "",
        "Objective preset applied (grpo_jax.presets); on the command line it takes effect "
        "where it appears: flags after it override it, flags before it are overridden (noted).",
    )
    model: ModelConfig = ModelConfig()
    tasks: TaskConfig = TaskConfig()
    sft: SFTConfig = SFTConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    rewards: RewardConfig = RewardConfig()
    optim: OptimConfig = OptimConfig()
    rollout: RolloutConfig = RolloutConfig()
    pool: PoolConfig = PoolConfig()
    lora: LoRAConfig = LoRAConfig()
    replay: ReplayConfig = ReplayConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    eval: rt.EvalConfig = rt.EvalConfig()
    sandbox: rt.SandboxConfig = rt.SandboxConfig()
    checkpoint: rt.CheckpointConfig = rt.CheckpointConfig()
    log: rt.LogConfig = rt.LogConfig()
    mesh: rt.MeshConfig = rt.MeshConfig()
    dist: rt.DistConfig = rt.DistConfig()
    runtime: rt.RuntimeConfig = rt.RuntimeConfig()

    def __post_init__(self):
        if not self.workdir.strip():
            fail(self, "workdir", "a run directory is required")
        _positive(self, ("steps",), strict=False)
        if self.resume_from is not None and self.resume_from < 0:
            fail(self, "resume_from", "must be >= 0 (a checkpoint step), or none for the newest intact one")
        if self.sft.steps is None and self.model.init_from:  # the no-SFT default would silently ignore them
            for path in _SFT_SETTINGS:
                if get_path(self, path) != _field_default(self, path):
                    fail(
                        self,
                        path,
                        "a pretrained model (--init_from) gets no SFT unless --sft_steps is given: give "
                        "--sft_steps=N for an SFT warm start, or drop it",
                    )
        self._derive()  # the checks below see the resolved values
        if self.sft.from_workdir and self.dist.enabled:
            fail(self, "sft.from_workdir", "one process only (not with --dist_*: untested there)")
        obj, ro = self.objective, self.rollout
        algorithm = algorithm_spec(obj.algorithm)
        n_rl = self.tasks.train_per_level * len(self.tasks.rl_levels)
        if ro.prompts_per_step > n_rl:
            fail(self, "rollout.prompts_per_step", f"must not exceed the {n_rl} RL training problems")
        split = obj.mini_batches * self.optim.micro_batches
        if ro.prompts_per_step % split:
            fail(
                self,
                "optim.micro_batches",
                f"mini_batches x micro_batches = {obj.mini_batches} x {self.optim.micro_batches} must divide "
                f"prompts_per_step={ro.prompts_per_step} (the batch is split by prompts, groups stay whole)",
            )
        if self.replay.enabled and self.replay.capacity < ro.prompts_per_step:
            fail(self, "replay.capacity", f"must be >= prompts_per_step={ro.prompts_per_step}")
        # an algorithm whose ratio is to the sampler already (DPPO) needs nothing more for off-policy samples
        if (
            (self.replay.enabled or ro.async_rewards)
            and not obj.loss.tis_enabled
            and not algorithm.ratio_to_sampler
        ):
            which = "replay.fraction" if self.replay.enabled else "rollout.async_rewards"
            fail(
                self,
                which,
                "replayed and asynchronous rollouts are off-policy: set the truncated "
                "importance-sampling cap objective.loss.tis_cap (e.g. 2)",
            )
        if obj.baseline != "group" and not self.pool.enabled:
            fail(self, "objective.baseline", "needs a policy pool (pool.capacity > 0)")
        if algorithm.check_run is not None:
            algorithm.check_run(self)
        if ro.max_turns > 1:
            self._check_multi_turn()
        self._check_engines()
        self._check_rewards()
        if self.sandbox.stop_on_failure and obj.multiscale_w_tests > 0:
            fail(
                self,
                "sandbox.stop_on_failure",
                f"multi-scale advantages (--multiscale_w_tests={obj.multiscale_w_tests}) need every test's "
                "result: drop one of them",
            )
        if self.curriculum.start_level >= len(self.tasks.rl_levels):
            fail(
                self,
                "curriculum.start_level",
                f"an index into rl_levels (0..{len(self.tasks.rl_levels) - 1})",
            )
        if obj.overlong_cache_len and obj.overlong_cache_len >= ro.max_new_tokens:
            fail(
                self,
                "objective.overlong_cache_len",
                f"must be < max_new_tokens={ro.max_new_tokens} (DAPO: "
                "L_cache 4096 of L_max 20480; scale it to the max completion length)",
            )
        _check_sub_settings(self, "", SUB_SETTINGS)

    def _check_engines(self) -> None:
        """--rollout_engine=continuous and --pack_tokens: what they cannot do is refused, one line each."""
        ro, width = self.rollout, self.optim.pack_tokens
        if ro.engine == "continuous" and self.dist.enabled:
            fail(
                self,
                "rollout.engine",
                "the continuous engine runs in one process (its host loop reads every slot): use "
                "--rollout_engine=static with --dist_*",
            )
        if width and width < ro.completion_len:
            fail(
                self,
                "optim.pack_tokens",
                "a packed row must hold the longest completion: >= the completion length "
                f"{ro.completion_len} (max_turns * max_new_tokens + (max_turns - 1) * feedback_tokens)",
            )
        if width and self.objective.mini_batches > 1:
            fail(
                self,
                "optim.pack_tokens",
                f"not with mini_batches={self.objective.mini_batches} (the packed layout is planned per "
                "micro-batch; use --pack_tokens=0 or --mini_batches=1)",
            )

    def _check_rewards(self) -> None:
        """--rewards: what the other sections must agree with, one line each."""
        rw, obj, max_len = self.rewards, self.objective, self.rollout.max_new_tokens * self.rollout.max_turns
        if rw.aggregation == "normalize_then_sum" and (
            obj.adv_method != "batch_std" or algorithm_spec(obj.algorithm).without_group_advantages
        ):
            fail(
                self,
                "rewards.aggregation",
                "GDPO's form normalises each reward in its group and the sum over the batch: it needs "
                "--adv_method=batch_std and a group-advantage algorithm",
            )
        if not rw.default and obj.baseline != "group":
            fail(
                self,
                "rewards.functions",
                f"the pool baseline (--baseline={obj.baseline}) is the pool's test reward: use "
                "--rewards=tests",
            )
        if "length" in rw.names:
            if obj.overlong_cache_len:
                fail(
                    self,
                    "rewards.functions",
                    "the length reward and --overlong_cache_len are both DAPO's overlong punishment: use one",
                )
            if rw.cache_len(max_len) >= max_len:
                fail(
                    self, "rewards.length_cache", f"must be < L_max = {max_len} (max_new_tokens x max_turns)"
                )

    def _check_multi_turn(self) -> None:
        """--max_turns > 1: the mechanisms whose samples are not trajectories are refused, one line each."""
        no_turns = algorithm_spec(self.objective.algorithm).without_multi_turn
        refuse = [
            ("objective.algorithm", bool(no_turns), no_turns),
            ("pool.capacity", self.pool.enabled, "the policy pool samples single-turn completions"),
            ("replay.fraction", self.replay.enabled, "replayed successes are single-turn completions"),
            (
                "dist.num_processes",
                self.dist.enabled,
                "feedback turns are graded in one process only for now",
            ),
        ]
        for path, bad, why in refuse:
            if bad:
                fail(self, path, f"not with --max_turns={self.rollout.max_turns}: {why} (use --max_turns=1)")

    def _derive(self) -> None:
        """The derived fields, in one place: the defaults that depend on the model (AUTO_DEFAULTS: a
        pretrained --init_from model gets no SFT and chat prompts, a model trained from scratch 300 SFT steps
        and plain prompts, unless the field was given), and the loss's max_len (Dr. GRPO's L) =
        max_new_tokens x max_turns (the model's own tokens of a whole trajectory)."""
        pick = 1 if self.model.init_from else 0
        if self.sft.steps is None:
            sft = dataclasses.replace(self.sft, steps=AUTO_DEFAULTS["sft.steps"][pick])
            object.__setattr__(self, "sft", sft)
        if self.tasks.prompt_format == "auto":
            fmt = AUTO_DEFAULTS["tasks.prompt_format"][pick]
            object.__setattr__(self, "tasks", dataclasses.replace(self.tasks, prompt_format=fmt))
        max_len = self.rollout.max_new_tokens * self.rollout.max_turns  # the model's tokens of all turns
        if self.objective.loss.max_len != max_len:
            loss = dataclasses.replace(self.objective.loss, max_len=max_len)
            object.__setattr__(self, "objective", dataclasses.replace(self.objective, loss=loss))

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


# the whole table of sub-settings of optional mechanisms (base.Mechanism: one rule), each section's beside it
SUB_SETTINGS: tuple[Mechanism, ...] = (
    *model.SUB_SETTINGS,
    *tasks.SUB_SETTINGS,
    *objective.SUB_SETTINGS,
    *rewards.SUB_SETTINGS,
    *loss.SUB_SETTINGS,
    *controller.SUB_SETTINGS,
    *rollout.SUB_SETTINGS,
    *rt.SUB_SETTINGS,
    Mechanism(
        "resume",
        "",
        "--resume",
        "resuming from the workdir's checkpoints",
        lambda c: c.resume,
        lambda c: "--noresume",
        ("resume_from",),
    ),
)

SECTIONS = (
    ModelConfig,
    TaskConfig,
    SFTConfig,
    ControllerConfig,
    *(a.section for a in algorithm_specs() if a.section is not None),
    ObjectiveConfig,
    PolicyLossConfig,
    RewardConfig,
    OptimConfig,
    RolloutConfig,
    PoolConfig,
    LoRAConfig,
    ReplayConfig,
    CurriculumConfig,
    rt.EvalConfig,
    rt.SandboxConfig,
    rt.CheckpointConfig,
    rt.LogConfig,
    rt.MeshConfig,
    rt.DistConfig,
    rt.RuntimeConfig,
    RunConfig,
)
