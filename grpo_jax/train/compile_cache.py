"""JAX's persistent compilation cache, on by default for the main job and the benchmarks.

    compile_cache.enable("")        # default: $GRPO_JAX_CACHE_DIR/xla, else ~/.cache/grpo_jax/xla
    compile_cache.enable("/path")   # a directory of your own (shared storage works for several hosts)
    compile_cache.enable("none")    # off

Every jitted function whose compilation takes at least `min_compile_s` is stored under its HLO fingerprint
(jax keys it by the computation, the compile options, the backend and the jax/jaxlib versions), so a second
run of the same configuration loads the sampler and the train step instead of recompiling them. The cached
executable is the one XLA would build, so results are bit-identical with or without the cache. Must be called
before the first compilation. In multi-process runs jax writes entries from process 0 only.
"""

from __future__ import annotations

import os

import jax

from grpo_jax.codegen.timelimits import cache_dir

MIN_COMPILE_S = 0.5  # smaller programs compile faster than they load


def default_dir() -> str:
    return str(cache_dir() / "xla")


def enable(setting: str = "", min_compile_s: float = MIN_COMPILE_S) -> str | None:
    """Turn the cache on in `setting` ("" = default_dir(), "none" = off); returns the directory or None."""
    if setting.strip().lower() == "none":
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    path = os.path.abspath(os.path.expanduser(setting or default_dir()))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"compilation cache directory {path}: {e.strerror}; give another or 'none'"
        ) from None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
