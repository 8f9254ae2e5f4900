"""Faults during a run of the main job: a sandbox worker killed from outside mid-batch, and a disk that
fills up while the run writes a checkpoint (one line on stderr, the previous checkpoint intact, the rerun
resumes from it)."""

from __future__ import annotations

import errno
import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time

import mainjob
import numpy as np
import pytest

from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.isolation import stray_sandbox_pids
from grpo_jax.sandbox.types import Job, Limits, Status
from grpo_jax.sandbox.types import TestCase as TC
from grpo_jax.train.checkpoint import Checkpointer
from grpo_jax.train.diskfull import EXIT_DISK_FULL, disk_full_error, disk_full_line
from grpo_jax.train.logging import MetricsLogger

TINY = mainjob.TINY

T_ADD = (TC("add(1, 2)", 3), TC("add(2, 2)", 4))


@pytest.fixture(scope="module")
def ex():
    with mainjob.executor() as e:
        yield e


def test_a_worker_killed_mid_batch_loses_and_duplicates_no_job():
    """12 jobs of 0.3 s on 2 slots; one slot's zygote is SIGKILLed from another thread after 0.2 s (its first
    job in flight). Every job gets its own verdict in order (odd jobs are wrong: a lost, duplicated or
    reordered verdict shows), only the job in flight on the killed slot is retried, once, with the right
    result; the slot is restarted once and no sandbox process is left behind."""
    jobs = [
        Job(
            f"import time\ntime.sleep(0.3)\ndef add(a, b):\n    return a + b{' + 1' * (i % 2)}  # {i}\n",
            T_ADD,
        )
        for i in range(12)
    ]
    with Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2)) as ex:
        (victim, _) = ex._zygote_pids()
        killer = threading.Timer(0.2, os.kill, (victim, signal.SIGKILL))
        killer.start()
        t0 = time.monotonic()
        got = ex.run(jobs)
        killer.join()
        elapsed = time.monotonic() - t0
        assert len(got) == 12
        assert [v.passed for v in got] == [i % 2 == 0 for i in range(12)], got
        assert [v.status for v in got] == [
            Status.PASSED if i % 2 == 0 else Status.WRONG_ANSWER for i in range(12)
        ]
        assert sum(v.retried for v in got) == 1, [v.retried for v in got]
        st = ex.stats()
        assert st["restarts"] == 1 and st["retries"] == 1, st
        assert victim not in ex._zygote_pids() and len(ex._zygote_pids()) == 2
        assert stray_sandbox_pids(ex.uids) == []
        assert all(
            v.passed
            for v in ex.run(
                [Job(f"def add(a, b):\n    return a + b  # after {i}\n", T_ADD) for i in range(2)]
            )
        )
        assert elapsed < 20


def _mount_tmpfs(where, size: str) -> str | None:
    """Mount a size-capped tmpfs at `where`: None when it worked, else why not (not root, no SYS_ADMIN)."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a size-capped tmpfs needs root"
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if r.returncode:
        return f"mount -t tmpfs not permitted here ({r.stderr.decode(errors='replace').strip()[:200]})"
    return None


def _used_bytes(mount) -> int:
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_a_full_disk_stops_the_run_with_one_line_and_the_rerun_resumes(ex, tmp_path):
    """The real main job on a size-capped tmpfs. First 2 GRPO steps with room (checkpoints 0 and 2, the logs,
    results.json); then the tmpfs is shrunk to what is used + 48 KiB, less than one checkpoint, and the same
    command with --steps=4 resumes from step 2 and finds the disk full at the latest when it saves step 4
    (whichever write hits it first, the logs of step 3 or 4 or that checkpoint: both are named correctly, and
    step 2 stays the newest intact checkpoint either way; the shrink makes which step deterministic, where a
    fixed size once let the timing of the log writes decide). The run ends with one line on stderr (no
    traceback) and exit status 74, naming step 2; with more space the same command resumes from step 2 (the
    partial step 4 is never taken for a step) and finishes."""
    disk = tmp_path / "disk"
    why = _mount_tmpfs(disk, "16m")
    if why:
        pytest.skip(why)
    try:
        wd = disk / "run"
        first = mainjob.subprocess_run(TINY, "--steps=2", f"--workdir={wd}", timeout=300)
        assert first.returncode == 0, first.stderr[-3000:]
        before = (wd / "results.json").read_bytes()
        size = (_used_bytes(disk) + 48 * 1024 + 4095) // 4096 * 4096
        subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)
        args = (TINY, "--steps=4")
        r = mainjob.subprocess_run(*args, f"--workdir={wd}", timeout=300)
        assert r.returncode == EXIT_DISK_FULL, (r.returncode, r.stderr[-3000:])
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
        (line,) = r.stderr.splitlines()
        assert re.fullmatch(
            rf"error: disk full while writing (a checkpoint|the logs) in {re.escape(str(wd))}: .*"
            r"No space left on device; the newest intact checkpoint is step 2 \(rerun to resume\)",
            line,
        ), line
        assert (wd / "results.json").read_bytes() == before  # the failed run wrote no results
        ck = Checkpointer(wd / "checkpoints", read_only=True)
        assert ck.all_steps() == [0, 2] and ck.intact_steps() == [0, 2]
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        results, out = mainjob.run(*args, workdir=wd, executor=ex)
        assert f"resumed from {wd / 'checkpoints'} at GRPO step 2" in out
        assert results["steps"] == 4 and results["resumed_from_step"] == 2
        assert sorted(mainjob.metrics(wd)) == [1, 2, 3, 4]  # each step once
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _raised_in(filename: str, exc: BaseException, during: BaseException | None = None) -> BaseException:
    """`exc` raised by code whose frame's file is `filename`, while handling `during` (its __context__)."""
    exc.__context__ = during
    try:
        exec(compile("raise exc", filename, "exec"), {"exc": exc})
    except BaseException as e:  # noqa: BLE001 - returned to the test
        return e
    raise AssertionError("not raised")


def test_the_disk_full_line_names_what_was_written_from_the_path_or_any_error_of_the_chain(tmp_path):
    """What the line says was being written: from the failed file's path when it lies in the checkpoints,
    else from the frames of the error that found the disk full, else from those of the errors raised again
    around it (an orbax / TensorStore write fails in a thread, with none of the writer's frames, and the
    waiting code raises it again)."""
    wd = str(tmp_path / "run")
    no_space = "No space left on device"
    head = rf"disk full while writing (.*) in {re.escape(wd)}: "

    def what(full, raised=None):
        assert disk_full_error(raised or full) is full
        return re.match(head, disk_full_line(full, wd, raised=raised)).group(1)

    in_ckpt = OSError(errno.ENOSPC, no_space, os.path.join(wd, "checkpoints", "4.orbax-tmp", "d", "0"))
    assert what(in_ckpt) == "a checkpoint"
    line = disk_full_line(in_ckpt, wd)
    assert line.endswith(f"{in_ckpt.filename}: {no_space}; no intact checkpoint (a rerun starts anew)"), line
    bare = RuntimeError(f"RESOURCE_EXHAUSTED: {no_space}")  # set in a thread: no frame of the writer
    assert what(bare) == "a file"
    again = RuntimeError(f"save failed: {no_space}")  # raised again while handling it
    assert (
        what(bare, _raised_in("/x/site-packages/orbax/checkpoint/future.py", again, bare)) == "a checkpoint"
    )
    logs = _raised_in("/x/grpo_jax/train/logging.py", OSError(errno.ENOSPC, no_space))
    assert what(logs) == "the logs"  # the first error's own frames decide before the chain's
    again = OSError(errno.ENOSPC, no_space)
    assert what(logs, _raised_in("/x/grpo_jax/train/checkpoint.py", again, logs)) == "the logs"
    other = _raised_in("/x/a.py", OSError(errno.ENOSPC, no_space, os.path.join(wd, "samples.jsonl")))
    assert what(other) == "a file"


def test_a_full_disk_under_the_logs_is_an_error_in_the_caller_not_a_hang(tmp_path):
    """MetricsLogger on a 256 KiB tmpfs, logging until the disk is full: an OSError (ENOSPC) in the caller,
    also when the TensorBoard writer thread hits it first (tensorboardX's thread would die and the next event
    block forever on its full queue); close() closes every file, so none fails again when collected."""
    disk = tmp_path / "disk"
    why = _mount_tmpfs(disk, "256k")
    if why:
        pytest.skip(why)
    unraisable, hook = [], sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        logger = MetricsLogger(disk / "run", run_info={})
        got = {}

        def fill():
            try:
                for step in range(100_000):
                    logger.scalars(step, {"x": step})
                    logger.histograms(step, {"h": np.random.default_rng(step).normal(size=2000)})
            except OSError as e:
                got["error"] = e

        th = threading.Thread(target=fill, daemon=True)
        th.start()
        th.join(30)
        assert not th.is_alive(), "the logger blocked on a full disk"
        assert got["error"].errno == errno.ENOSPC, got
        try:
            logger.close()
        except OSError as e:
            assert e.errno == errno.ENOSPC
        logger = None
        gc.collect()
        assert unraisable == []
    finally:
        sys.unraisablehook = hook
        subprocess.run(["umount", "-l", str(disk)], check=False)
