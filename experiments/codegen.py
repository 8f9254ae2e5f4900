"""The main job: SFT warm start, then GRPO on sandboxed code rewards.

    python -m experiments.codegen --flagfile=experiments/flagfiles/quickstart.flags
    python -m experiments.codegen --flagfile=experiments/flagfiles/quickstart.flags --preset=dr_grpo \
        --workdir=runs/dr_grpo
    python -m experiments.codegen --helpfull             # every flag with its meaning and default
    python launch/local.py --num_processes=2 --devices_per_process=2 -- \
        --flagfile=experiments/flagfiles/quickstart.flags --workdir=runs/dist   # 2 processes on this machine

Every flag is a field of grpo_jax.config.RunConfig (grpo_jax.cli derives the flags from the tree). Precedence:
the last setting of a field on the command line wins, flagfiles expanded where they appear, and `--preset`
sets all its fields where it appears; the run prints every field where a preset and a flag disagree. A bad
value stops the run with one line naming the flag and what is valid, before anything starts or is written.
The run resumes from the workdir's latest checkpoint by default (`--noresume` refuses a workdir that has one).
A disk that fills up while the run writes a checkpoint or its logs ends it with one line on stderr naming the
newest intact checkpoint and exit status 74 (EX_IOERR); the same command, given space, resumes from it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import sys
import traceback
import warnings

from absl import app, flags
from absl import logging as absl_logging

from grpo_jax import cli

FLAGS = flags.FLAGS
cli.define_flags(FLAGS)
flags.DEFINE_bool("dry_run", False, "Check the flags, print the resolved configuration as JSON and exit.")

EXIT_DISK_FULL = 74  # EX_IOERR: free space (or move the workdir) and rerun the same command to resume
_NO_SPACE = ("No space left on device", "Disk quota exceeded")  # strerror(ENOSPC), strerror(EDQUOT)


def _no_space(e: BaseException) -> bool:
    """A write that found the disk (or the quota) full: an OSError with errno ENOSPC / EDQUOT, or an
    orbax / TensorStore error (ValueError / RuntimeError, e.g. RESOURCE_EXHAUSTED) whose message says so."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(e, (OSError, ValueError, RuntimeError)) and any(s in str(e) for s in _NO_SPACE)


def disk_full_error(e: BaseException) -> BaseException | None:
    """When `e` is a disk-full error: the first of its chain (`e`, what it was raised from or while handling,
    ...), the write that found the disk full rather than a cleanup that found it again. None for any other
    error, also one raised while handling a full disk (a bug shows its traceback)."""
    if not _no_space(e):
        return None
    seen, first = set(), None
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if _no_space(e) and not (first is not None and first.__cause__ is e):  # not the error a wrapper names
            first = e
        e = e.__cause__ or e.__context__
    return first


class _QuietDiskFull(logging.Filter):
    """Drops the log records of a disk-full error that the run reports in its one line: orbax's save threads
    and asyncio ("exception was never retrieved") log each failed write with its traceback. A record without
    the error attached (e.g. a warning of a write the run does without) still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or disk_full_error(exc) is None


def quiet_disk_full_logs() -> None:
    """Keep a full disk to the run's one line: _QuietDiskFull on the handlers that print log records (absl's
    on the root logger), and an unraisable-exception hook that drops what a failed save leaves behind
    (TensorStore's callbacks into orbax's event loops that closed on the error; files whose final flush
    finds the disk full)."""
    quiet = _QuietDiskFull()
    for h in [*logging.getLogger().handlers, logging.lastResort]:
        if h is not None:
            h.addFilter(quiet)
    previous = sys.unraisablehook

    def hook(u):
        closed_loop = isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"
        if not closed_loop and (u.exc_value is None or disk_full_error(u.exc_value) is None):
            previous(u)

    sys.unraisablehook = hook


def disk_full_line(e: BaseException, workdir: str) -> str:
    """The one line of a run stopped by a full disk: what it was writing, where, and the step to resume."""
    frames = " ".join(f.filename for f in traceback.extract_tb(e.__traceback__))
    if "orbax" in frames or "checkpoint" in frames:
        what = "a checkpoint"
    elif "logging.py" in frames or "tensorboard" in frames.lower():
        what = "the logs"
    else:
        what = "a file"
    path = getattr(e, "filename", None) if isinstance(e, OSError) else None
    if path is None:
        m = re.search(r'(?:Failed writing|Error writing local file): "([^"]+)"', str(e))
        path = m.group(1) if m else None
    reason = next((s for s in _NO_SPACE if s in str(e)), os.strerror(getattr(e, "errno", errno.ENOSPC) or 28))
    ckpt_dir = os.path.join(os.path.abspath(workdir), "checkpoints")
    try:
        from grpo_jax.train.checkpoint import Checkpointer

        steps = Checkpointer(ckpt_dir, read_only=True).intact_steps() if os.path.isdir(ckpt_dir) else []
        newest = (
            f"the newest intact checkpoint is step {steps[-1]} (rerun to resume)"
            if steps
            else ("no intact checkpoint (a rerun starts anew)")
        )
    except Exception as e2:  # noqa: BLE001 - the line must come out whatever the checkpoints' state
        newest = f"the checkpoints in {ckpt_dir} could not be read ({type(e2).__name__})"
    return f"disk full while writing {what} in {workdir}: {f'{path}: ' if path else ''}{reason}; {newest}"


def main(argv):
    absl_logging.set_verbosity(absl_logging.WARNING)  # JAX / orbax INFO lines would bury the run's output
    if len(argv) > 1:
        cli.fail(f"unexpected positional arguments: {' '.join(argv[1:])}")
    try:
        cfg, notes = cli.config_from_flags(FLAGS)
    except cli.FlagError as e:
        cli.fail(str(e))
    for n in notes:
        print(n, file=sys.stderr if FLAGS.dry_run else sys.stdout, flush=True)
    if FLAGS.dry_run:
        print(json.dumps(cfg.to_json(), indent=1))
        return

    from grpo_jax.train import distributed

    try:  # join the other processes first: nothing may touch a JAX device before this
        distributed.initialize(cfg.dist)
    except distributed.PeerLost as e:
        cli.fail(str(e))

    from grpo_jax.sandbox.executor import Executor
    from grpo_jax.sandbox.types import Limits
    from grpo_jax.train import compile_cache
    from grpo_jax.train.loop import RunConfigError, run

    # before the first compilation; an unusable directory: one warning line, the run goes on without it
    cache_dir = compile_cache.enable(cfg.runtime.compilation_cache)

    main_process = distributed.context(cfg.dist).is_main
    quiet_disk_full_logs()
    limits = Limits(wall_s=cfg.sandbox.wall_s, cpu_s=cfg.sandbox.cpu_s)
    with Executor(num_workers=cfg.sandbox.workers, limits=limits) as executor:  # this process's own sandbox
        if main_process:
            print(f"sandbox: isolation tier {executor.tier_line()}", flush=True)
            print(f"compilation cache: {cache_dir or 'off'}", flush=True)
        try:
            run(cfg, executor, notes=notes)
        except RunConfigError as e:  # e.g. the workdir holds a different run
            cli.fail(str(e))
        except distributed.PeerLost as e:  # another process hung or died: end now, do not wait for it
            distributed.fail_lost(e)
        except Exception as e:  # with several processes, often a collective whose peer died
            full = disk_full_error(e)
            if full is not None:
                print(f"error: {disk_full_line(full, cfg.workdir)}", file=sys.stderr, flush=True)
                # the failed save's coroutines are collected at exit: no warning about them after the line
                warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
                if cfg.dist.enabled:  # as fail_lost: JAX's shutdown would wait for the other processes
                    os._exit(EXIT_DISK_FULL)
                sys.exit(EXIT_DISK_FULL)
            if cfg.dist.enabled:
                distributed.fail_after_error(e, cfg.dist.heartbeat_s)
            raise


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(main, flags_parser=cli.parse)
