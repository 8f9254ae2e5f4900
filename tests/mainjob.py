"""The main job in-process for the tests: `experiments.codegen`'s flag handling (grpo_jax.cli.resolve) and its
run (grpo_jax.train.loop.run) without a new interpreter, so a short run costs its compilation only (the
persistent compilation cache is on, as in the main job). What only a process shows — the exit status and the
one error line, a SIGKILL and its resume, several processes — stays with subprocess tests of the real
`python -m experiments.codegen` (one per contract)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from grpo_jax import cli
from grpo_jax.runtime import compile_cache
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits
from grpo_jax.train import loop

ROOT = Path(__file__).resolve().parents[1]
TINY = "--flagfile=experiments/flagfiles/tiny_test.flags"
_CACHE = []


def executor() -> Executor:
    """The sandbox of a TINY run (--sandbox_workers=2 --sandbox_wall_s=2); use it as a context."""
    return Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2))


def config(*args, workdir):
    """(RunConfig, notes) of a command line of the main job."""
    return cli.resolve(["codegen", *args, f"--workdir={workdir}"])


def run(*args, workdir, executor) -> tuple[dict, str]:
    """(results, everything the run printed) of the main job with these flags, in this process."""
    if not _CACHE:  # as the main job does, before the first compilation
        _CACHE.append(compile_cache.enable("", min_compile_s=0.0))
    cfg, notes = config(*args, workdir=workdir)
    lines: list[str] = []
    results = loop.run(cfg, executor, print_fn=lines.append, notes=notes)
    return results, "\n".join(lines)


def metrics(workdir) -> dict[int, dict]:
    """{step: the train-step line of metrics.jsonl}."""
    rows = [json.loads(x) for x in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {x["step"]: x for x in rows if "reward" in x}


def command(*args) -> list[str]:
    return [sys.executable, "-m", "experiments.codegen", *args]


def subprocess_run(*args, timeout=600, env=None):
    """The real main job in a new process (for what only a process shows); `env`: its environment."""
    return subprocess.run(command(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def kill_after_checkpoint(*args, workdir, step: int, timeout=300) -> None:
    """Start the real main job and SIGKILL it once its checkpoint `step` exists (before the run ends)."""
    proc = subprocess.Popen(
        command(*args, f"--workdir={workdir}"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout
    try:
        while not (Path(workdir) / "checkpoints" / str(step)).exists():
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, f"no step-{step} checkpoint within {timeout} s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)


def killed_and_resumed(*args, workdir, step: int) -> dict:
    """The real main job SIGKILLed after its checkpoint `step`, then the same command again: the resumed run's
    results.json (the killed run wrote none; the rerun exits 0)."""
    kill_after_checkpoint(*args, workdir=workdir, step=step)
    assert not (Path(workdir) / "results.json").exists()
    resumed = subprocess_run(*args, f"--workdir={workdir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return json.loads((Path(workdir) / "results.json").read_text())
