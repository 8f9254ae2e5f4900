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
    - "isclose": expected = (x, rel_tol, abs_tol), math.isclose;
    - "json_eq": call-based tests of competitive-programming datasets (LeetCode / APPS fn_name style,
      `call="fn(*ARGS_LITERAL)"` or `"Solution().method(*ARGS_LITERAL)"`, `expected` = the JSON data): tuples
      become lists recursively on both sides (LiveCodeBench's grade_call_based: "don't penalize model if it
      produces tuples instead of lists"), then type-strict equality as "eq" (bool is not int, an int and a
      float compare by value, a set is not a list, dict keys keep their types; exact unless `float_tol` > 0,
      as LiveCodeBench and APPS compare with `==`). APPS's one-element wrapping of outputs is undone by the
      loader (grpo_jax.data.formats.apps), not here.

    A stdin/stdout test is `TestCase(call="", kind="stdout", stdin=<input text>, expected=<expected stdout>)`:
    the program runs once per test as `__main__` with `stdin` on its standard input (a sealed in-memory file,
    never argv) and its standard output comes back to the parent, which compares it with `expected`
    (`grading.stdout_matches`: exact after normalising line ends, trailing whitespace and trailing blank
    lines, else token by token with numbers equal by value and, where one is not an integer, within
    `float_tol`, default `grading.STDOUT_FLOAT_TOL` = 1e-6 absolute or relative). `stdin` and `expected` are
    str (bytes are accepted too); `stdin` is required ("" for no input) and only for this kind. A Job's tests
    are either all stdout tests or none (docs/SANDBOX.md §3.7).

    Two extensions of a stdout test, for datasets such as open-r1/codeforces (docs/SANDBOX.md §3.7):

    - `checker` (Python source; "" = none): for problems with several right answers the output is judged by
      this program instead of `stdout_matches`, as open-r1's runner does: after the program ended normally,
      the checker runs as a separate sandboxed program, `python3 checker.py <input> <correct output>
      <solution output>` (blank lines removed from both outputs), and the test passes iff it exits normally
      and prints "1" or "100" (whitespace ignored). `expected` is then the correct output it is given. A
      checker that crashes or times out fails the test (wrong_answer: garbage output can crash a checker).
    - `input_file` / `output_file` (plain file names, "" = the standard stream): old Codeforces problems read
      `input.txt` and write `output.txt`. With `input_file` the input text is that file in the program's
      working directory and stdin is empty; with `output_file` the text judged is that file's content after
      the program exited (its stdout is ignored; no such file: wrong_answer).

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
    stdin: str | None = None  # kind="stdout" only: the test's standard input
    checker: str = ""  # kind="stdout" only: a Python checker that judges the output instead of `expected`
    input_file: str = ""  # kind="stdout" only: the input is this file of the work dir (stdin empty)
    output_file: str = ""  # kind="stdout" only: the answer is this file of the work dir (stdout ignored)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"TestCase kind={self.kind!r} is not a comparison; valid: {', '.join(KINDS)}")
        if not isinstance(self.call, str):
            raise ValueError(
                f"TestCase call must be a str (a Python expression), not {type(self.call).__name__}"
            )
        if self.kind == "stdout":
            bad = []
            if self.call != "":
                bad.append(f'call={self.call[:60]!r} (must be "")')
            if not isinstance(self.stdin, str | bytes):
                bad.append(f"stdin={type(self.stdin).__name__} (must be the input text, '' for none)")
            if not isinstance(self.expected, str | bytes):
                bad.append(f"expected={type(self.expected).__name__} (must be the expected stdout text)")
            if self.wrap or self.expected_expr is not None or self.prelude:
                bad.append("wrap / expected_expr / prelude (call tests only)")
            if not isinstance(self.checker, str):
                bad.append(f"checker={type(self.checker).__name__} (must be Python source, '' for none)")
            elif self.checker and not self.checker.strip():
                bad.append("checker=<blank> (must be Python source, '' for none)")
            for field in ("input_file", "output_file"):
                why = plain_file_name_error(getattr(self, field))
                if why:
                    bad.append(f"{field}={getattr(self, field)!r} ({why})")
            if self.input_file and self.input_file == self.output_file:
                bad.append(f"input_file = output_file = {self.input_file!r} (must differ)")
            if bad:
                raise ValueError(
                    "a stdin/stdout test is TestCase(call='', kind='stdout', stdin=<str>, expected=<str>"
                    "[, checker=<Python source>][, input_file=<name>][, output_file=<name>]); got "
                    + ", ".join(bad)
                )
        else:
            if self.stdin is not None:
                raise ValueError(f"TestCase stdin= is only for kind='stdout' tests, not kind={self.kind!r}")
            extras = [f for f in ("checker", "input_file", "output_file") if getattr(self, f)]
            if extras:
                raise ValueError(
                    f"TestCase {' / '.join(extras)} is only for kind='stdout' tests, not kind={self.kind!r}"
                )
            if not self.call.strip():
                raise ValueError(f"TestCase kind={self.kind!r} needs call= a Python expression, got ''")


def plain_file_name_error(name: object) -> str:
    """Why `name` cannot be a file-I/O test's file name ("" if it can; "" itself means no file). A plain name
    in the program's working directory only: no '/', no '.' or '..', no NUL, at most 255 bytes, so that
    neither the program's side nor the zygote (which opens the output file as root) ever resolves a path."""
    if not isinstance(name, str):
        return f"must be a str, not {type(name).__name__}"
    if name in (".", ".."):
        return "must be a plain file name"
    if "/" in name or "\0" in name:
        return "must be a plain file name (no '/' and no NUL)"
    if len(name.encode("utf-8", "surrogateescape")) > 255:
        return "longer than 255 bytes"
    return ""


# the comparisons a TestCase may name (grading.check_value; "invalid" is set by the executor's oracle)
KINDS = (
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "truthy",
    "falsy",
    "in",
    "not_in",
    "contains",
    "not_contains",
    "abs_lt",
    "abs_le",
    "isclose",
    "json_eq",
    "stdout",
    "invalid",
)


def is_stdio(tests) -> bool:
    """True for a stdin/stdout job's tests (all kind="stdout"), False for call tests; ValueError for a mix."""
    kinds = {getattr(t, "kind", None) == "stdout" for t in tests}
    if len(kinds) > 1:
        n = sum(getattr(t, "kind", None) == "stdout" for t in tests)
        raise ValueError(
            f"a Job mixes {n} stdin/stdout tests (kind='stdout') with {len(tests) - n} call tests; "
            "valid: all tests of one Job are stdout tests, or none is"
        )
    return kinds == {True}


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
    stdin_bytes: int = 16 << 20  # the largest standard input of one stdout test (a larger one: infra_error)


@dataclasses.dataclass(frozen=True)
class Job:
    program: str
    tests: tuple[TestCase, ...] = ()
    child_check: str | None = None
    setup_code: str = ""
    limits: Limits | None = None  # None: the executor's defaults
    time_limit_s: float | None = None  # a tighter wall limit for this job (CPU follows); never looser
    # True: stop at the first failing test; the verdict's `tests` then ends with that test and its status is
    # that test's. stdio jobs run no further test; call jobs run their calls in one child, which stops at the
    # first call that raises (a wrong value is only known in the parent: later calls ran but are not reported)
    stop_on_failure: bool = False

    def __post_init__(self):
        tests = self.tests if isinstance(self.tests, tuple | list) else ()
        if is_stdio(tests):
            if self.child_check is not None or self.setup_code:
                raise ValueError(
                    "a stdin/stdout Job (kind='stdout' tests) takes no child_check and no setup_code; "
                    "valid: program + stdout tests (+ limits, time_limit_s, stop_on_failure)"
                )
        if not isinstance(self.stop_on_failure, bool):
            raise ValueError(f"Job stop_on_failure must be a bool, got {self.stop_on_failure!r}")


@dataclasses.dataclass(frozen=True)
class TestResult:
    passed: bool
    status: Status  # PASSED, WRONG_ANSWER, RUNTIME_ERROR, TIMEOUT, ... for this test
    seconds: float = 0.0
    error: str = ""  # short, parent-sanitised text (exception type/message), never child objects
    # a wrong answer's actual result as short text (the repr of a call's value, a program's stdout), for
    # execution feedback (grpo_jax.codegen.feedback); "" otherwise
    got: str = ""


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: Status
    passed: bool
    # one per parent-graded test, in order; shorter on an early stop (a timeout or a crash ends a call job's
    # child; Job.stop_on_failure ends at the first failing test) and empty on a syntax error
    tests: tuple[TestResult, ...] = ()
    child_check_passed: bool | None = None  # None: the job had no child check
    seconds: float = 0.0
    detail: str = ""  # short human-readable reason (truncated stderr excerpt, limit hit, ...)
    cached: bool = False
    retried: bool = False

    @property
    def tests_passed(self) -> int:
        return sum(t.passed for t in self.tests)
