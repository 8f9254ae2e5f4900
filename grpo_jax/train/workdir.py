"""One run per workdir: the run's process 0 holds an exclusive lock on `<workdir>/.lock` for the run's life.

    lock = workdir.lock(path)   # WorkdirBusy (one line, naming the workdir and the holder) if a run holds it
    lock.release()              # Run.close(); the process's exit releases it too (SIGKILL included)

The lock is flock(2) on an open file: the kernel drops it with the process, so a killed run leaves no stale
lock (the file stays, naming the last holder; the next run takes it over). The file records the holder's pid
and host, for the message of a run that is refused. Runs that only read a workdir (the evaluator, export)
take no lock. On a filesystem without flock the run goes on unlocked, with one warning line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys

LOCK_NAME = ".lock"


class WorkdirBusy(RuntimeError):
    """The workdir is held by another run (or its lock file cannot be created)."""


class Lock:
    """A held workdir lock (fd None: none taken, the filesystem has no flock)."""

    def __init__(self, path: str, fd: int | None):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing the descriptor drops the flock


def lock(workdir: str) -> Lock:
    """Take `<workdir>/.lock` (the directory must exist) without waiting; WorkdirBusy naming the workdir and
    the holder when another run holds it."""
    path = os.path.join(os.path.abspath(workdir), LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise WorkdirBusy(
            f"--workdir={workdir}: cannot create its lock file {path} ({e.strerror}); "
            "give a writable --workdir"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid not recorded yet"
            os.close(fd)
            raise WorkdirBusy(
                f"--workdir={workdir} is in use by another run ({holder}), which holds its lock {path}; "
                "wait for it to end or stop it, or give another --workdir"
            ) from None
        os.close(fd)  # e.g. ENOLCK / EOPNOTSUPP: a filesystem without flock
        print(
            f"warning: --workdir={workdir}: cannot lock {path} ({e.strerror}); running without the lock, so "
            "a second run on this workdir would not be refused",
            file=sys.stderr,
            flush=True,
        )
        return Lock(path, None)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return Lock(path, fd)
