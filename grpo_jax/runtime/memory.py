"""This process's memory: its peaks (host resident set, device allocators) and giving freed C-heap pages back
to the OS. Host side; JAX is imported only to ask the devices for their allocator peaks."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
import sys
from collections.abc import Sequence
from typing import Any


def memory_metrics(devices: Sequence[Any] | None = None) -> dict[str, float]:
    """This process's memory peaks so far, in MiB: `memory/host_peak_rss_mb` (the OS's high-water mark of the
    resident set, `getrusage` ru_maxrss: monotone over the process's life, so SFT and evaluations count too)
    and, on accelerators whose runtime reports it, `memory/device_peak_mb` (the largest of the devices'
    allocator peaks, `memory_stats()["peak_bytes_in_use"]`; absent on CPU). `devices` defaults to this
    process's local devices."""
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB (macOS reports bytes)
    rss_mb = rss_kb / 2**20 if sys.platform == "darwin" else rss_kb / 1024
    out = {"memory/host_peak_rss_mb": float(rss_mb)}
    if devices is None:
        import jax  # noqa: PLC0415  (needed only here)

        devices = jax.local_devices()
    reported = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in devices]
    peaks = [p for p in reported if p is not None]
    if peaks:
        out["memory/device_peak_mb"] = float(max(peaks)) / 2**20
    return out


@functools.lru_cache(maxsize=1)
def libc():
    """This process's C library (ctypes.CDLL, loaded once), or None when none can be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_host_memory() -> None:
    """Give the C heap's free pages back to the OS (glibc `malloc_trim(0)`; a no-op without glibc).

    XLA:CPU's freed buffers (a sampler's KV caches, a train step's activations) and the compiler's memory
    stay in glibc's per-thread arenas, so the resident set grows phase by phase and the next phase's peak
    adds to it: the SmolLM2 run's resident baseline rose from 2.1 to 3.2-3.5 GB over its first evaluation
    and three steps without this, and stayed at 2.3-2.7 GB with it
    (docs/results/mixed_precision_and_memory.md). Called after each evaluation sampling call, after a
    rollout's sampling and at the start of each rollout (the previous train step's buffers); measured
    3-80 ms a call (SmolLM2, after a 50 x 128 evaluation batch)."""
    trim = getattr(libc(), "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)
