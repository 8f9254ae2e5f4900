"""What a reward function is given: plain data only (strings, numbers, booleans, tuples of them).

A user's reward (`--rewards=module:function`) is called in the trainer process as

    function(problem: RewardProblem, reply: str, program: str, grade: Grade) -> float

`reply` is the model's reply (with --max_turns > 1: the trajectory's last reply), `program` the program text
the sandbox graded, `grade` the sandbox's verdict on it. No live object reaches the function: the generated
program was executed only in the sandbox, and here it is text (tests/test_reward_functions.py holds it).
"""

from __future__ import annotations

import dataclasses

from grpo_jax.problem import Problem
from grpo_jax.sandbox.types import Verdict


@dataclasses.dataclass(frozen=True)
class RewardProblem:
    """The problem a reply answers."""

    task_id: str
    prompt: str  # what the model was shown (before the chat template)
    description: str  # the natural-language task, where the source has one
    entry_point: str  # the function under test ("" for stdin/stdout programs)
    reference: str  # a program that passes every test
    level: int
    source: str  # synthetic, mbpp, humaneval, codecontests, ...

    @classmethod
    def of(cls, p: Problem) -> RewardProblem:
        return cls(p.task_id, p.prompt, p.description, p.entry_point, p.reference, int(p.level), p.source)


@dataclasses.dataclass(frozen=True)
class Grade:
    """The sandbox's verdict on the program: overall and per test (in the problem's test order; shorter than
    `tests_total` when the program stopped early, e.g. a syntax error or a timeout)."""

    passed: bool  # every test (and the child check) passed
    status: str  # passed, wrong_answer, syntax_error, timeout, runtime_error, ...
    tests: tuple[bool, ...]  # per test: passed
    test_status: tuple[str, ...]  # per test: its status
    tests_total: int  # the problem's number of tests
    detail: str  # a short reason, e.g. the error's last line

    @classmethod
    def of(cls, v: Verdict, tests_total: int) -> Grade:
        return cls(
            bool(v.passed),
            str(v.status.value),
            tuple(bool(t.passed) for t in v.tests),
            tuple(str(t.status.value) for t in v.tests),
            int(tests_total),
            str(v.detail),
        )


@dataclasses.dataclass(frozen=True)
class Sample:
    """One graded reply, as the built-in rewards see it (a user's function gets its first four fields)."""

    problem: RewardProblem
    reply: str
    program: str
    grade: Grade
    tests_reward: float  # the grader's reward for this sample ("tests")
    length: int  # the model's tokens (all turns)
    chat: bool  # the prompt format is chat (the code is a fenced block of the reply)
