"""Where a main-job run's host memory goes, phase by phase (Linux).

    python -m experiments.memory_phases --flagfile=experiments/flagfiles/smollm2.flags --steps=3 \\
        --workdir=/tmp/mem_run [any other main-job flag]

Runs the main job (experiments.codegen's arguments, in this process) and prints one line per phase, in order:
model build, state placement, each evaluation sampling call (with its prompt batch shape), each evaluation,
each checkpoint save, each rollout and train step, finish. Per line:
  rss    the resident set at the phase's end (GB, /proc/self/status VmRSS)
  peak   the highest resident set DURING the phase (GB; the kernel's high-water mark, reset between phases
         through /proc/self/clear_refs, so each phase reports its own)
  arrays the bytes of the live JAX arrays (jax.live_arrays(); two arrays aliasing one buffer count twice)
  heap   glibc's heap bytes in use (mallinfo2: compiled executables, runtime objects) and free-but-kept
The whole run's peak is the largest `peak`. The numbers describe the process as it runs; this tool changes
nothing in it (the main job itself returns freed heap pages to the OS: grpo_jax.train.logging).
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import time
from unittest import mock

T0 = time.perf_counter()


class _MallInfo2(ctypes.Structure):
    _names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(n, ctypes.c_size_t) for n in _names.split()]


def _status_gb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1e6  # kB -> GB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _heap() -> str:
    from grpo_jax.runtime.memory import libc

    mallinfo2 = getattr(libc(), "mallinfo2", None)  # glibc >= 2.33
    if mallinfo2 is None:
        return ""
    mallinfo2.restype = _MallInfo2
    mi = mallinfo2()
    return f"  heap {mi.uordblks / 1e9:.2f} in use, {mi.fordblks / 1e9:.2f} free"


def mark(name: str) -> None:
    """One line for the phase that just ended; resets the high-water mark for the next one."""
    import jax

    arrays = sum(a.nbytes for a in jax.live_arrays()) / 1e9
    rss, peak = _status_gb("VmRSS"), _status_gb("VmHWM")
    head = f"[{time.perf_counter() - T0:7.1f} s] {name:34s}"
    print(f"{head} rss {rss:5.2f}  peak {peak:5.2f}  arrays {arrays:5.2f}{_heap()}", flush=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _wrapped(fn, label: str, block: bool = False):
    def wrapped(*a, **k):
        mark(f"(before {label})")
        out = fn(*a, **k)
        if block:
            import jax

            jax.block_until_ready(out)
        mark(label)
        return out

    return wrapped


def main(argv: list[str]) -> None:
    """Run the main job with `argv` (experiments.codegen's flags), a line per phase on stdout. The phases
    are observed through patched grpo_jax.train.loop functions, restored on return."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:
        sys.exit(f"error: memory_phases needs Linux's /proc/self/clear_refs (writable): {e}")
    from grpo_jax import cli
    from grpo_jax.eval import evaluation
    from grpo_jax.runtime import compile_cache
    from grpo_jax.sandbox.executor import Executor
    from grpo_jax.sandbox.types import Limits
    from grpo_jax.train import loop

    try:
        cfg, notes = cli.resolve(["codegen", *argv])
    except cli.FlagError as e:  # one line, as the main job's
        cli.fail(str(e))
    compile_cache.enable(cfg.runtime.compilation_cache)
    mark("imports")

    def build(*a, **k):
        run = real_build(*a, **k)
        mark("build (model, tokenizer, problems)")
        inner = getattr(run.rollout, "inner", run.rollout)
        inner.produce = _wrapped(inner.produce, "rollout")
        run.train_step = _wrapped(run.train_step, "train step", block=True)
        return run

    real_sample_fn = evaluation.sample_fn

    def sample_fn(*a, **k):
        fn = real_sample_fn(*a, **k)

        def sample(prompt, *a):
            out = fn(prompt, *a)
            mark(f"  evaluation batch {tuple(prompt.shape)}")
            return out

        return sample

    real_build = loop.build
    patches = {
        "build": build,
        "placed_state": _wrapped(loop.placed_state, "state placed"),
        "evaluate": _wrapped(loop.evaluate, "evaluate"),
        "save": _wrapped(loop.save, "checkpoint save"),
        "finish": _wrapped(loop.finish, "finish"),
    }
    limits = Limits(wall_s=cfg.sandbox.wall_s, cpu_s=cfg.sandbox.cpu_s)
    with contextlib.ExitStack() as stack:
        for name, fn in patches.items():
            stack.enter_context(mock.patch.object(loop, name, fn))
        stack.enter_context(mock.patch.object(evaluation, "sample_fn", sample_fn))
        executor = stack.enter_context(Executor(num_workers=cfg.sandbox.workers, limits=limits))
        loop.run(cfg, executor, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
