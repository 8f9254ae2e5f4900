"""The executor's public data types: what goes in (`Job` with its `TestCase`s), what comes out (`Verdict`).

Stdlib only: this module imports nothing of grpo_jax (the problem type, `grpo_jax.problem.Problem`, builds on
`TestCase` from here, never the other way round).

The contract (docs/SANDBOX.md §3): `Executor.run(jobs)` returns exactly one `Verdict` per job, in order,
and never
raises. `passed` is True only if every parent-graded test returned a value equal (type-strictly) to its
expected value AND the child check (if any) completed without error. Exit status and stdout are never the
verdict.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


@dataclasses.dataclass(frozen=True)
class TestCase:
    """One parent-graded test: the child evaluates `call`, the parent judges the plain value it returns.

    `call` (a Python expression) is the only part sent to the sandboxed child, which evaluates it after the
    program ran and returns plain data (None, bool, int, float, str, bytes, complex, list, tuple, set, dict of
    those; subclasses reduced to their builtin data). The parent then applies `wrap` (plain-data functions
    such as `set`, `sorted`, `round(., n)`, innermost first) and the comparison `kind` against `expected`:

    - "eq" / "ne": type-strict equality (bool is not int; `float_tol` > 0 allows |got - expected| <= tol);
    - "lt" / "le" / "gt" / "ge": ordering of two numbers (or two values of one type among str / list / tuple);
    - "truthy" / "falsy": `assert CALL` / `assert not CALL` (expected unused);
    - "in" / "not_in": got in expected; "contains" / "not_contains": expected in got;
    - "abs_lt" / "abs_le": expected = (x, tol), abs(got - x) < tol (<=);
    - "isclose": expected = (x, rel_tol, abs_tol), math.isclose.

    `expected` never leaves the parent. When it is not a literal (`10**12 + 1`, `math.pi`), `expected_expr`
    holds the expression and `prelude` the import lines it needs: the executor evaluates it once in a separate
    sandboxed child that never sees a candidate, and fills `expected` in before grading. `source` is the
    original assert text, for reports.
    """

    __test__ = False  # not a pytest test class

    call: str
    expected: Any = None
    source: str = ""
    float_tol: float = 0.0
    kind: str = "eq"
    wrap: tuple[tuple[str, tuple], ...] = ()
    expected_expr: str | None = None
    prelude: str = ""


class Status(enum.StrEnum):
    PASSED = "passed"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    SYNTAX_ERROR = "syntax_error"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    OUTPUT_LIMIT = "output_limit"
    INFRA_ERROR = "infra_error"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-program resource limits (docs/SANDBOX.md §3 defaults)."""

    wall_s: float = 4.0
    cpu_s: int = 4
    memory_bytes: int = 1 << 30
    processes: int = 32
    output_bytes: int = 1 << 20
    result_bytes: int = 1 << 20
    file_bytes: int = 16 << 20
    open_files: int = 64
    source_bytes: int = 256 << 10
    workdir_bytes: int = 64 << 20


@dataclasses.dataclass(frozen=True)
class Job:
    program: str
    tests: tuple[TestCase, ...] = ()
    child_check: str | None = None
    setup_code: str = ""
    limits: Limits | None = None  # None: the executor's defaults
    time_limit_s: float | None = None  # a tighter wall limit for this job (CPU follows); never looser


@dataclasses.dataclass(frozen=True)
class TestResult:
    passed: bool
    status: Status  # PASSED, WRONG_ANSWER, RUNTIME_ERROR, TIMEOUT, ... for this test
    seconds: float = 0.0
    error: str = ""  # short, parent-sanitised text (exception type/message), never child objects


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: Status
    passed: bool
    tests: tuple[TestResult, ...] = ()  # one per parent-graded test, in order (may be shorter on early stop)
    child_check_passed: bool | None = None  # None: the job had no child check
    seconds: float = 0.0
    detail: str = ""  # short human-readable reason (truncated stderr excerpt, limit hit, ...)
    cached: bool = False
    retried: bool = False

    @property
    def tests_passed(self) -> int:
        return sum(t.passed for t in self.tests)
