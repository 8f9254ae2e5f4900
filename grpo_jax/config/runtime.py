"""How the run is executed and observed, not what it optimises: held-out evaluation, the sandbox, checkpoints,
logs, the device mesh, the processes (jax.distributed) and the compilation cache."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.config.base import Mechanism, _check_sub_settings, _choice, _positive, opt
from grpo_jax.errors import fail


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: greedy pass@1 and unbiased pass@k from `samples` temperature samples."""

    FLAG_PREFIX: ClassVar[str] = "eval_"
    every: int = opt(0, "Held-out evaluation every N GRPO steps (0 = after SFT and at the end only).")
    samples: int = opt(
        8, "Samples per held-out problem for pass@k (0 = greedy pass@1 only; then --eval_ks=)."
    )
    ks: tuple[int, ...] = opt((1, 8), "k values of pass@k (empty with --eval_samples=0).")
    batch: int = opt(16, "Prompts per evaluation sampler call.")
    mbpp: int = opt(
        0,
        "Also evaluate greedy pass@1 on the first N problems of MBPP's test split (task ids "
        "11-510; 0 = off, 500 = all), reported as mbpp/pass@1.",
    )
    humaneval: bool = opt(
        False, "Also evaluate greedy pass@1 on HumanEval's 164 problems (humaneval/pass@1)."
    )
    codeio: int = opt(
        0,
        "Also evaluate greedy pass@1 on the first N problems of CodeI/O's held-out split, graded on their "
        "hidden tests (docs/data/CODEIO.md; 0 = off), reported as codeio/pass@1.",
    )
    max_turns: int = opt(
        0,
        "Turns of the held-out evaluation with execution feedback (turn{t}/pass@k and fix_rate for t = "
        "1..N; 0 = the run's --max_turns). E.g. 2 with --max_turns=1: does a single-turn policy use "
        "feedback? (Uses --feedback_tokens.)",
    )

    def __post_init__(self):
        _positive(self, ("every", "max_turns"), strict=False)
        _positive(self, ("batch",))
        _positive(self, ("samples",), strict=False)
        _positive(self, ("codeio",), strict=False)
        if not 0 <= self.mbpp <= 500:
            fail(self, "mbpp", "must be in [0, 500] (the size of MBPP's test split)")
        if self.samples == 0 and self.ks:
            fail(self, "ks", "must be empty with samples=0 (greedy pass@1 only)")
        if self.samples and (not self.ks or any(not 1 <= k <= self.samples for k in self.ks)):
            fail(self, "ks", f"every k must be in [1, samples={self.samples}]")


TIME_LIMITS = ("reference", "fixed")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """The code-reward executor (grpo_jax.sandbox): worker slots and per-program limits."""

    FLAG_PREFIX: ClassVar[str] = "sandbox_"
    workers: int = opt(2, "Sandbox worker slots.")
    wall_s: float = opt(
        2.0,
        "Wall-clock limit per program (seconds; caps the per-problem limits); the CPU limit is its ceiling.",
    )
    deadline_s: float = opt(120.0, "Deadline for one batch of programs (seconds).")
    time_limits: str = opt(
        "reference",
        "Per-problem wall limits: 'reference' = min(--sandbox_wall_s, max(floor, factor x the reference "
        "solution's measured seconds)), measured once and cached (grpo_jax.codegen.timelimits); 'fixed' = "
        "--sandbox_wall_s for every problem.",
        choices=TIME_LIMITS,
    )
    time_limit_floor_s: float = opt(
        0.5, "With --sandbox_time_limits=reference: the smallest limit (seconds)."
    )
    time_limit_factor: float = opt(
        5.0, "With --sandbox_time_limits=reference: the multiple of the reference time."
    )
    stop_on_failure: bool = opt(
        False,
        "Run a program's tests only up to its first failure (rewards and pass@k are the same: they need all "
        "tests to pass; faster on problems with many hidden tests); the per-test results then lack the "
        "tests after it, so --multiscale_w_tests > 0 refuses it.",
    )

    def __post_init__(self):
        _positive(self, ("workers", "wall_s", "deadline_s", "time_limit_floor_s", "time_limit_factor"))
        _choice(self, "time_limits", TIME_LIMITS)
        _check_sub_settings(self, "sandbox", SUB_SETTINGS)

    @property
    def cpu_s(self) -> int:
        return max(1, int(self.wall_s + 0.999))


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints of the whole run state (also after SFT, at the end and on SIGTERM/SIGINT)."""

    FLAG_PREFIX: ClassVar[str] = "checkpoint_"
    every: int = opt(25, "Checkpoint every N GRPO steps (0 = only after SFT, at the end and on a signal).")
    keep: int = opt(2, "Checkpoints kept.", flag="keep_checkpoints")
    export_hf: bool = opt(
        False,
        "At the end, also write the policy as a Hugging Face directory (workdir/hf: "
        "config.json, model.safetensors, tokenizer files; LoRA adapters merged) for "
        "transformers / vLLM. On demand: python -m experiments.export.",
        flag="export_hf",
    )

    def __post_init__(self):
        _positive(self, ("every",), strict=False)
        _positive(self, ("keep",))


@dataclasses.dataclass(frozen=True)
class LogConfig:
    FLAG_PREFIX: ClassVar[str] = ""
    every: int = opt(
        1, "Console line and histograms every N steps (scalars are logged every step).", flag="log_every"
    )
    sample_every: int = opt(10, "Log sample completions every N steps (0 = never).", flag="sample_log_every")

    def __post_init__(self):
        _positive(self, ("every",))
        _positive(self, ("sample_every",), strict=False)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The device mesh of the run (grpo_jax.runtime.sharding): named axes data x fsdp x tensor over every
    device of every process. The rollout batch is split over data x fsdp (a group never straddles devices);
    parameters, optimizer moments and the reference are sharded over fsdp (ZeRO-3 style: each leaf's largest
    divisible dimension) and tensor (Megatron: q/k/v/gate/up by columns, o/down by rows). The product must
    equal the global device count (checked when the run starts, where the devices are known)."""

    FLAG_PREFIX: ClassVar[str] = "mesh_"
    data: int = opt(-1, "Data-parallel axis size (-1 = every device not used by the fsdp and tensor axes).")
    fsdp: int = opt(1, "Parameter-sharding (FSDP / ZeRO-3) axis size; also splits the batch.")
    tensor: int = opt(1, "Tensor-parallel (Megatron) axis size.")
    cpu_devices: int = opt(
        0,
        "CPU backend only: split this process's cores into N JAX devices (jax_num_cpu_devices), so the "
        "mesh runs N shards side by side; 0 = JAX's default (one device, or "
        "--xla_force_host_platform_device_count). Pays off where single-threaded small ops dominate (the "
        "tiny model's sampler), not on SmolLM2.",
    )

    def __post_init__(self):
        _positive(self, ("fsdp", "tensor"))
        _positive(self, ("cpu_devices",), strict=False)
        if self.data != -1 and self.data < 1:
            fail(self, "data", "must be >= 1, or -1 for every device not used by fsdp x tensor")


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How this process runs, not what it computes (results do not depend on it)."""

    FLAG_PREFIX: ClassVar[str] = ""
    compilation_cache: str = opt(
        "",
        "JAX's persistent compilation cache directory (grpo_jax.runtime.compile_cache): empty = "
        "$GRPO_JAX_CACHE_DIR/xla or ~/.cache/grpo_jax/xla; 'none' = off. A second run of the same "
        "configuration loads its compiled steps instead of recompiling.",
    )


DIST_CLUSTERS = ("none", "auto")


@dataclasses.dataclass(frozen=True)
class DistConfig:
    """Multi-process / multi-host runs on JAX's own runtime (jax.distributed; grpo_jax.runtime.distributed).
    One process per host (or per accelerator); every process runs the same program (SPMD), grades its own
    rows of the batch in its own sandbox, and process 0 writes the logs. CPU collectives use gloo."""

    FLAG_PREFIX: ClassVar[str] = "dist_"
    cluster: str = opt(
        "none",
        "none: one process unless --dist_coordinator is given; auto: jax.distributed.initialize() "
        "detects the cluster (SLURM, TPU VM pods, Kubernetes, Open MPI).",
        choices=DIST_CLUSTERS,
    )
    coordinator: str = opt(
        "", "Coordinator HOST:PORT (process 0's address) for an explicit multi-process run."
    )
    num_processes: int = opt(1, "Processes in an explicit multi-process run (with --dist_coordinator).")
    process_id: int = opt(0, "This process's index, 0 .. num_processes - 1 (with --dist_coordinator).")
    init_timeout_s: int = opt(300, "Seconds to wait for every process to join at start-up.")
    heartbeat_s: int = opt(
        60, "JAX's heartbeat timeout: a process silent this long (dead, or its host lost) ends the run."
    )
    step_timeout_s: int = opt(
        1800,
        "Every GRPO step starts at a barrier: a process that does not reach it within this many "
        "seconds (hung) ends the run with an error naming it.",
    )

    def __post_init__(self):
        _choice(self, "cluster", DIST_CLUSTERS)
        _positive(self, ("num_processes", "init_timeout_s", "heartbeat_s", "step_timeout_s"))
        if self.coordinator:
            host, _, port = self.coordinator.rpartition(":")
            if not host or not port.isdigit():
                fail(self, "coordinator", "must be HOST:PORT, e.g. 10.0.0.1:1234")
            if self.cluster == "auto":
                fail(
                    self,
                    "coordinator",
                    "give either --dist_cluster=auto or an explicit coordinator, not both",
                )
            if not 0 <= self.process_id < self.num_processes:
                fail(self, "process_id", f"must be in 0..{self.num_processes - 1} (num_processes)")
        elif self.num_processes != 1 or self.process_id != 0:
            which = "num_processes" if self.num_processes != 1 else "process_id"
            fail(self, which, "needs --dist_coordinator=HOST:PORT (or --dist_cluster=auto)")

    @property
    def enabled(self) -> bool:
        return bool(self.coordinator) or self.cluster == "auto"


# the sub-settings of these sections' optional mechanisms (base.Mechanism: one rule)
SUB_SETTINGS: tuple[Mechanism, ...] = (
    Mechanism(
        "reference_time_limits",
        "sandbox",
        "--sandbox_time_limits=reference",
        "per-problem time limits from the reference solutions",
        lambda s: s.time_limits == "reference",
        lambda s: f"--sandbox_time_limits={s.time_limits}",
        ("time_limit_floor_s", "time_limit_factor"),
    ),
)
