"""A disk that fills up during a run: recognising the error (an OSError, or orbax / TensorStore's message),
keeping the failed write's log records and unraisable-exception reports out of the output, and the one line
the main job ends with (what it was writing, where, and the newest intact checkpoint to resume from)."""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import traceback

EXIT_DISK_FULL = 74  # EX_IOERR: free space (or move the workdir) and rerun the same command to resume
_NO_SPACE = ("No space left on device", "Disk quota exceeded")  # strerror(ENOSPC), strerror(EDQUOT)


def _no_space(e: BaseException) -> bool:
    """A write that found the disk (or the quota) full: an OSError with errno ENOSPC / EDQUOT, or an
    orbax / TensorStore error (ValueError / RuntimeError, e.g. RESOURCE_EXHAUSTED) whose message says so."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(e, (OSError, ValueError, RuntimeError)) and any(s in str(e) for s in _NO_SPACE)


def _chain(e: BaseException | None) -> list[BaseException]:
    """`e` and the errors it was raised from or while handling, outermost first."""
    out: list[BaseException] = []
    while e is not None and all(e is not x for x in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def disk_full_error(e: BaseException) -> BaseException | None:
    """When `e` is a disk-full error: the first of its chain (`e`, what it was raised from or while handling,
    ...), the write that found the disk full rather than a cleanup that found it again. None for any other
    error, also one raised while handling a full disk (a bug shows its traceback)."""
    if not _no_space(e):
        return None
    first = None
    for x in _chain(e):
        if _no_space(x) and not (first is not None and first.__cause__ is x):  # not the error a wrapper names
            first = x
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


def _under(path, directory: str) -> bool:
    return os.path.abspath(str(path)).startswith(directory + os.sep)


def _writer(errors: list[BaseException]) -> str | None:
    """What the frames of `errors` were writing: "a checkpoint", "the logs", or None when they do not say."""
    frames = " ".join(f.filename for x in errors for f in traceback.extract_tb(x.__traceback__))
    if "orbax" in frames or "checkpoint" in frames:
        return "a checkpoint"
    if "logging.py" in frames or "tensorboard" in frames.lower():
        return "the logs"
    return None


def disk_full_line(e: BaseException, workdir: str, raised: BaseException | None = None) -> str:
    """The one line of a run stopped by a full disk: what it was writing, where, and the step to resume.
    `e` is the write that found the disk full (disk_full_error), `raised` the error the run ended with. What
    was being written is read from the file's path when it lies in the checkpoints, else from the frames of
    every error of the chain: the first error alone may carry none of the writer's frames (an orbax /
    TensorStore write fails in a thread and is raised again by the code that waited for it)."""
    path = getattr(e, "filename", None) if isinstance(e, OSError) else None
    if path is None:
        m = re.search(r'(?:Failed writing|Error writing local file): "([^"]+)"', str(e))
        path = m.group(1) if m else None
    ckpt_dir = os.path.join(os.path.abspath(workdir), "checkpoints")
    in_ckpt = "a checkpoint" if path is not None and _under(path, ckpt_dir) else None
    what = in_ckpt or _writer([e]) or _writer(_chain(raised)) or "a file"
    reason = next((s for s in _NO_SPACE if s in str(e)), os.strerror(getattr(e, "errno", errno.ENOSPC) or 28))
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
