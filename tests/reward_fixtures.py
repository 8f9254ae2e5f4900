"""User reward functions for the reward tests (imported by path: --rewards=tests.reward_fixtures:NAME)."""

from __future__ import annotations

import math
import os

SEEN: list = []  # (problem, reply, program, grade) of every call of `record`


def record(problem, reply, program, grade):
    SEEN.append((problem, reply, program, grade))
    return 0.5


def raises(problem, reply, program, grade):
    raise ZeroDivisionError("boom")


def nan(problem, reply, program, grade):
    return math.nan


def text(problem, reply, program, grade):
    return "1.0"


def two_args(problem, reply):
    return 0.0


def fails_at_step_two(problem, reply, program, grade):
    """Raises from its 2nd batch of calls on (a run with group 4 calls it 16 times per step of 4 prompts)."""
    fails_at_step_two.calls += 1
    if fails_at_step_two.calls > 16:
        raise ValueError("not this time")
    return 0.0


fails_at_step_two.calls = 0  # type: ignore[attr-defined]


def fails_when_told(problem, reply, program, grade):
    """Raises while GRPO_TEST_REWARD_FAIL is set (a bug that a fixed run no longer has)."""
    if os.environ.get("GRPO_TEST_REWARD_FAIL"):
        raise RuntimeError("told to fail")
    return 1.0


def five(problem, reply, program, grade):
    """A constant far above the success threshold: a success rate read off the combined reward would be 1."""
    return 5.0
