"""The built-in rewards (spec.BUILTIN names them): batch functions of graded samples -> float64 [N].

Each takes the step's Samples (grpo_jax.rewards.types) and a Context; the static ones (format, lint) share one
ruff pass per batch (Context.static)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from grpo_jax.codegen import pipeline
from grpo_jax.rewards import static
from grpo_jax.rewards.types import Sample


class Context:
    """What the built-ins need beyond the samples: L_max and L_cache of `length`, and the batch's ruff reports
    (computed once, on first use)."""

    def __init__(self, samples: Sequence[Sample], max_len: int, length_cache: int):
        self.samples, self.max_len, self.length_cache = samples, max_len, length_cache
        self._static: list[static.Report] | None = None

    def static(self) -> list[static.Report]:
        if self._static is None:
            self._static = static.analyse([s.program for s in self.samples])
        return self._static


def tests(ctx: Context) -> np.ndarray:
    return np.asarray([s.tests_reward for s in ctx.samples], np.float64)


def tests_fraction(ctx: Context) -> np.ndarray:
    return np.asarray(
        [
            sum(s.grade.tests) / s.grade.tests_total if s.grade.tests_total else float(s.grade.passed)
            for s in ctx.samples
        ],
        np.float64,
    )


def one_fence(reply: str) -> bool:
    """Exactly one fenced code block in a chat reply (an unclosed last fence counts as one)."""
    return len(pipeline.fenced_blocks(reply)) == 1


def format_reward(ctx: Context) -> np.ndarray:
    reports = ctx.static()
    return np.asarray(
        [
            float(r.parses and (one_fence(s.reply) or not s.chat))
            for s, r in zip(ctx.samples, reports, strict=True)
        ],
        np.float64,
    )


def lint(ctx: Context) -> np.ndarray:
    return np.asarray([1.0 / (1 + r.diagnostics) if r.parses else 0.0 for r in ctx.static()], np.float64)


def length(ctx: Context) -> np.ndarray:
    """DAPO eq. 13 in tokens (as grpo_jax.core.advantages.soft_overlong_punishment, in numpy)."""
    n = np.asarray([s.length for s in ctx.samples], np.float64)
    start = ctx.max_len - ctx.length_cache
    return np.where(n <= start, 0.0, np.where(n <= ctx.max_len, (start - n) / ctx.length_cache, -1.0))


FUNCTIONS: dict[str, Callable[[Context], np.ndarray]] = {
    "tests": tests,
    "tests_fraction": tests_fraction,
    "format": format_reward,
    "lint": lint,
    "length": length,
}
