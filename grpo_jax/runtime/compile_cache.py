"""JAX's persistent compilation cache, on by default for the main job and the benchmarks.

    compile_cache.enable("")        # default: $GRPO_JAX_CACHE_DIR/xla, else ~/.cache/grpo_jax/xla
    compile_cache.enable("/path")   # a directory of your own (shared storage works for several hosts)
    compile_cache.enable("none")    # off

Every jitted function whose compilation takes at least `min_compile_s` is stored under its HLO fingerprint
(jax keys it by the computation, the compile options, the backend and the jax/jaxlib versions), so a second
run of the same configuration loads the sampler and the train step instead of recompiling them. The cached
executable is the one XLA would build, so results are bit-identical with or without the cache. Must be called
before the first compilation. In multi-process runs jax writes entries from process 0 only.

The cache never stops a run. A directory that cannot be created or written (a file in its place, no
permission, a read-only filesystem) turns it off with one warning line. An entry jax cannot read (truncated,
garbage) is compiled instead, as jax does; its warnings (two lines each, one per entry) become one line for
the whole process, and so do those of entries it cannot write.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from typing import TypedDict

import jax

from grpo_jax.codegen.timelimits import cache_dir

MIN_COMPILE_S = 0.5  # smaller programs compile faster than they load

# jax's warnings (jax._src.compiler) for an entry it cannot read or write; it goes on without the entry
_JAX_ENTRY_ERRORS = (
    "Error reading persistent compilation cache entry",
    "Error writing persistent compilation",
)


class _State(TypedDict):
    path: str | None
    warned: bool
    hooked: bool


_STATE: _State = {"path": None, "warned": False, "hooked": False}


def default_dir() -> str:
    return str(cache_dir() / "xla")


def enable(setting: str = "", min_compile_s: float = MIN_COMPILE_S) -> str | None:
    """Turn the cache on in `setting` ("" = default_dir(), "none" = off); returns the directory, or None when
    off (asked for, or the directory is unusable: one warning line on stderr, and the run goes on)."""
    if setting.strip().lower() == "none":
        jax.config.update("jax_enable_compilation_cache", False)
        _STATE["path"] = None
        return None
    path = os.path.abspath(os.path.expanduser(setting or default_dir()))
    problem = unusable(path)
    if problem:
        jax.config.update("jax_enable_compilation_cache", False)
        _STATE["path"] = None
        _warn(
            f"compilation cache directory {path}: {problem}; running without the cache (everything is "
            "compiled); give a writable directory with --compilation_cache=DIR, or none"
        )
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _STATE["path"] = path
    _one_line_entry_errors()
    return path


def directory() -> str | None:
    """The directory `enable` turned the cache on in; None when it is off (or was never enabled here)."""
    # jax's Config holds its options as dynamic attributes (declared for pytype only): mypy sees none of them
    return _STATE["path"] if jax.config.jax_enable_compilation_cache else None  # type: ignore[attr-defined]


def unusable(path: str) -> str | None:
    """Why `path` cannot hold the cache (created if missing; a file is written and removed), or None."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except FileExistsError:
        return "a file is there, not a directory"
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def _one_line_entry_errors() -> None:
    """jax's per-entry cache warnings -> the first one as one line; the rest of the process's are dropped."""
    if _STATE["hooked"]:
        return
    _STATE["hooked"] = True
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if not text.startswith(_JAX_ENTRY_ERRORS):
            return shown(message, category, filename, lineno, file, line)
        if _STATE["warned"]:
            return None
        _STATE["warned"] = True
        then = (
            "compiled instead (delete the directory to clear a damaged entry)"
            if text.startswith("Error reading")
            else "not saved, the run goes on"
        )
        _warn(
            f"compilation cache {_STATE['path']}: {text[:1].lower()}{text[1:300]}; {then}; later cache "
            "errors of this process are not shown"
        )
        return None

    warnings.showwarning = show
