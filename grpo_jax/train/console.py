"""The console: the step line with its ETA (Progress), durations, the final before / after table."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def format_duration(seconds: float) -> str:
    """42s, 9m42s, 1h02m, 2d03h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


class Progress:
    """A console line: "step 12/200 (6%)  reward 0.312  SuccessRate 0.25  kl 0.0012  3.1 s/step  ETA 9m42s".

    Seconds per step are a moving average over the last `window` intervals between calls (each interval
    weighted by its number of steps). The first interval (from construction, usually including compilation)
    is used only until a second one exists. Metric names show their last "/" component; missing keys are
    skipped. `line` only builds the string (and records the timing); `show` also prints it with print_fn.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        print_fn: Callable[[str], Any] | None = print,
        *,
        window: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total_steps = int(total_steps)
        self.print_fn = print_fn
        self.clock = clock
        self._last = (int(start_step), clock())
        self._first: tuple[int, float] | None = None  # (steps, seconds) of the first interval
        self._intervals: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)

    def seconds_per_step(self) -> float | None:
        intervals = list(self._intervals) or ([self._first] if self._first else [])
        n = sum(k for k, _ in intervals)
        return sum(t for _, t in intervals) / n if n else None

    def line(self, step: int, metrics: Mapping[str, Any], keys: Sequence[str] = ()) -> str:
        step = int(step)
        now = self.clock()
        last_step, last_time = self._last
        if step > last_step:
            if self._first is None:
                self._first = (step - last_step, now - last_time)
            else:
                self._intervals.append((step - last_step, now - last_time))
            self._last = (step, now)
        pct = 100.0 * step / self.total_steps if self.total_steps else 100.0
        parts = [f"step {step}/{self.total_steps} ({pct:.0f}%)"]
        for k in keys:
            if k in metrics:
                parts.append(f"{k.rsplit('/', 1)[-1]} {float(np.asarray(metrics[k])):.3g}")
        sps = self.seconds_per_step()
        if sps is None:
            parts.append("-- s/step  ETA --")
        else:
            parts.append(f"{sps:.3g} s/step  ETA {format_duration(max(self.total_steps - step, 0) * sps)}")
        return "  ".join(parts)

    def show(self, step: int, metrics: Mapping[str, Any], keys: Sequence[str] = ()) -> str:
        """`line(...)`, printed with print_fn (if any); returns the line."""
        text = self.line(step, metrics, keys)
        if self.print_fn is not None:
            self.print_fn(text)
        return text


# -- per-problem pass rates ----------------------------------------------------------------------------------


def final_table(results: dict) -> str:
    sft_r, grpo_r = results.get("sft", {}), results.get("grpo", {})
    keys = [k for k in sft_r if k.startswith("pass@") or k.endswith("/pass@1")]  # incl. mbpp/, humaneval/
    before = "after SFT" if "sft_seconds" in results or "sft_from" in results else "before GRPO"
    lines = ["", f"{'held-out metric':<24}{before:>12}{'after GRPO':>12}"]
    for k in keys:
        g = grpo_r.get(k)
        lines.append(f"{k:<24}{sft_r[k]:>12.3f}{(f'{g:.3f}' if g is not None else '-'):>12}")
    return "\n".join(lines)
