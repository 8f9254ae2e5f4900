"""Where a run ran, for run.json: the git commit and dirty flag, the host, the versions, the devices."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from typing import Any


def git_info(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """{"git_sha": HEAD or None, "git_dirty": bool or None} of the git repository holding `path`.

    Default path: this package's directory (the code's revision, whatever the working directory)."""
    cwd = os.fspath(path) if path is not None else os.path.dirname(os.path.abspath(__file__))

    def git(*args):
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()

    try:
        sha = git("rev-parse", "HEAD") or None
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return {"git_sha": sha, "git_dirty": dirty}


def environment() -> dict[str, Any]:
    import flax
    import jax

    try:
        import optax

        optax_version = optax.__version__
    except Exception:  # pragma: no cover - optax is a dependency
        optax_version = None
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax_version,
        "backend": jax.default_backend(),
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "devices": [str(d) for d in jax.devices()],
        "local_device_count": jax.local_device_count(),
    }


# -- MetricsLogger -------------------------------------------------------------------------------------------
