"""What every format module shares: the error type, the row context, field readers, the tests and the prompt
of a stdin/stdout or call-based problem (stdlib only, no JAX).

A format module (grpo_jax/data/formats/NAME.py) converts one row (a dict, as a JSON line or an Arrow/parquet
row reads) into a `Problem` with these helpers; a malformed row raises one `DatasetError` naming the row and
the field, what was wrong and what is valid.

Call-based tests (`call_test`) resolve the function as the graders of APPS (hendrycks/apps
eval/testing_util.py), TACO and LiveCodeBench (lcb_runner/evaluation/testing_util.py) do: a method of
`Solution` when the PROGRAM defines `class Solution`, else its top-level function. The test's call keeps the
starter code's form (`Solution().fn(*ARGS)` for a `class Solution` starter, else `fn(*ARGS)`) and
`call_setup(fn, ...)` (run in the sandboxed child after the program, before the calls) supplies the other
form when the program wrote only that one: a top-level `fn` under a `class Solution` starter, or a
`class Solution` without a top-level `fn` otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from grpo_jax.problem import Problem, TestCase

STDIO_INSTRUCTION = (
    "Write a complete Python 3 program that reads the input from standard input and writes the answer to "
    "standard output."
)
FUNCTION_INSTRUCTION = (
    "Complete the function `{fn}` of the starter code. It is called as `{fn}(...)` with each test's "
    "arguments, and its return value is checked."
)
FUNCTION_NO_STARTER_INSTRUCTION = (
    "Write a Python function `{fn}`. It is called as `{fn}(...)` with each test's arguments, and its return "
    "value is checked."
)
SOLUTION_INSTRUCTION = (
    "Complete the method `{fn}` of `class Solution` in the starter code. It is called as "
    "`Solution().{fn}(...)` with each test's arguments, and its return value is checked."
)
MAX_EXAMPLE_CHARS = 2000  # a public example longer than this is not shown in the prompt (never cut)


class DatasetError(ValueError):
    """One malformed row (or file): `where` is "PATH:LINE" ("PATH:item N" in a JSON list, "PATH: row group G,
    row R" in a parquet file, "PATH: batch B, row R" in an Arrow file), `field` the field at fault; the
    message says what was wrong and what is valid."""

    def __init__(self, where: str, field: str, what: str, valid: str = ""):
        self.where, self.field, self.what = where, field, what
        super().__init__(f"{where}: {field}: {what}" + (f"; valid: {valid}" if valid else ""))


@dataclasses.dataclass(frozen=True)
class Ctx:
    """Where a row is and the loader's options: `where` (for errors), `index` (the row's 0-based position in
    the whole input, over every shard), grade_tests / visible_tests / max_tests as `load` takes them."""

    where: str
    index: int
    grade_tests: str = "all"
    visible_tests: int | None = 0
    max_tests: int | None = None


# ------------------------------------------------------------------------------------------------------------
# Field readers
# ------------------------------------------------------------------------------------------------------------
def need(row: dict, field: str, ctx: Ctx, valid: str):
    """row[field], or DatasetError "missing" (None counts as missing: parquet's null)."""
    if field not in row or row[field] is None:
        raise DatasetError(ctx.where, field, "missing", valid)
    return row[field]


def text(row: dict, field: str, ctx: Ctx, *, required: bool = True, nonempty: bool = False) -> str:
    if not required and row.get(field) is None:
        return ""
    v = need(row, field, ctx, "a string")
    if not isinstance(v, str):
        raise DatasetError(ctx.where, field, f"a {kind_of(v)}", "a string")
    if nonempty and not v.strip():
        raise DatasetError(ctx.where, field, "empty", "a non-empty string")
    return v


def kind_of(v: Any) -> str:
    """How an error names a value's type: "JSON list", "JSON int" (the wording of the JSONL era, kept)."""
    return f"JSON {type(v).__name__}"


def task_id(row: dict, field: str, ctx: Ctx) -> str:
    v = need(row, field, ctx, "a string or an integer")
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, str) and not v.strip()):
        raise DatasetError(ctx.where, field, f"{v!r}", "a non-empty string or an integer")
    return str(v)


def fn_name(v: Any, ctx: Ctx, field: str) -> str:
    if not isinstance(v, str) or not v.isidentifier():
        raise DatasetError(ctx.where, field, f"{v!r} is not a function name", "a Python identifier")
    return v


def json_field(v: Any, ctx: Ctx, field: str, valid: str) -> Any:
    """A field that datasets store either as a JSON string or as nested data (parquet structs / lists): the
    string is parsed, anything else is returned as it is."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except (json.JSONDecodeError, RecursionError) as e:
        raise DatasetError(ctx.where, field, f"not JSON ({getattr(e, 'msg', e)})", valid) from None


def lines(v: Any, ctx: Ctx, field: str) -> str:
    """A stdin / stdout text: a string, or a list of lines joined with "\\n" (APPS / TACO)."""
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "\n".join(v)
    raise DatasetError(ctx.where, field, f"a {kind_of(v)}", "a string or a list of lines")


def solution_class(starter_code: str) -> bool:
    """LeetCode style: the starter code is a `class Solution` stub, so the tests call `Solution().fn(...)`
    (a program that defines `fn` at top level instead is still accepted: `call_setup`)."""
    return "class Solution" in starter_code


def py_literal(value: Any) -> str:
    """JSON data as a Python expression that evaluates to it: True/False/None, str, int, float (non-finite
    floats as 1e999 / -1e999 / float('nan')), lists, dicts (str or int keys)."""
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return repr(value)
    if t is float:
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "1e999" if value > 0 else "-1e999"
        return repr(value)
    if t is list or t is tuple:
        return "[" + ", ".join(py_literal(x) for x in value) + "]"
    if t is dict:
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not JSON data: {t.__name__}")


def int_keys(d: dict) -> dict:
    """APPS/TACO testing_util: "JSON forces dictionaries to have string keys; this undoes this" (when every
    key converts; otherwise the dict is kept as it is, as their try/except does)."""
    try:
        return {int(k): v for k, v in d.items()}
    except (ValueError, TypeError):
        return d


# ------------------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------------------
def stdio_test(stdin: str, expected: str, label: str, **kw) -> tuple[TestCase, str]:
    """A stdin/stdout test and how the prompt shows it (`kw`: further TestCase fields, e.g. a checker)."""
    case = TestCase(call="", kind="stdout", stdin=stdin, expected=expected, source=label, **kw)
    shown = f"Input:\n```\n{stdin.rstrip()}\n```\nOutput:\n```\n{expected.rstrip()}\n```"
    return case, shown


def listed_stdio_tests(items: list[dict], ctx: Ctx, field: str) -> list[tuple[TestCase, str]]:
    """stdin/stdout tests from a list of {"input", "output"} (strings or lists of lines), "test i" each."""
    return [
        stdio_test(
            lines(t["input"], ctx, f"{field}[{i}].input"),
            lines(t["output"], ctx, f"{field}[{i}].output"),
            f"test {i}",
        )
        for i, t in enumerate(items)
    ]


def call_test(
    fn: str, solution_cls: bool, args: list, expected: Any, label: str, ctx: Ctx, field: str
) -> tuple[TestCase, str]:
    """A call-based test `Solution().fn(*ARGS)` (class starter) or `fn(*ARGS)`, compared as JSON data."""
    target = f"Solution().{fn}" if solution_cls else fn
    try:
        args_text = py_literal(list(args))
        shown_args = ", ".join(py_literal(a) for a in args)
        shown_out = py_literal(expected)
    except (TypeError, RecursionError) as e:
        raise DatasetError(ctx.where, field, str(e) or "nested too deeply", "JSON data") from None
    case = TestCase(call=f"{target}(*{args_text})", expected=expected, kind="json_eq", source=label)
    return case, f">>> {target}({shown_args})\n{shown_out}"


def call_setup(fn: str, solution_cls: bool) -> str:
    """The child-side lines (after the program, before the calls) that let a call-based problem's tests find
    the function the way APPS / TACO / LiveCodeBench's graders do: `Solution().fn` when the program defines
    `class Solution`, else the top-level `fn` (see the module docstring)."""
    if solution_cls:
        return (
            f"if not isinstance(globals().get('Solution'), type) and callable(globals().get({fn!r})):\n"
            f"    class Solution:\n"
            f"        {fn} = staticmethod({fn})\n"
        )
    return (
        f"if not callable(globals().get({fn!r})) and isinstance(globals().get('Solution'), type) "
        f"and callable(getattr(globals()['Solution'], {fn!r}, None)):\n"
        f"    {fn} = Solution().{fn}\n"
    )


def build_prompt(
    statement: str,
    *,
    test_kind: str,
    fn_name: str = "",
    starter_code: str = "",
    examples: tuple[str, ...] = (),
    instruction: str = "",
) -> str:
    """The plain-text user message of a stdio / call problem: the statement, the shown examples, the starter
    code in a ```python block, then the instruction (STDIO_INSTRUCTION; FUNCTION_INSTRUCTION,
    SOLUTION_INSTRUCTION for a `class Solution` starter, FUNCTION_NO_STARTER_INSTRUCTION; `instruction`
    replaces it where a format has its own). The model's chat template (if any) is applied by
    grpo_jax.codegen.pipeline.render_prompt."""
    parts = [statement.strip()]
    if examples:
        parts.append(
            "Examples:\n\n" if len(examples) > 1 else "Example:\n\n",
        )
        parts[-1] += "\n\n".join(examples)
    if starter_code.strip():
        parts.append(f"Starter code:\n```python\n{starter_code.rstrip()}\n```")
    if instruction:
        parts.append(instruction)
    elif test_kind == "stdio":
        parts.append(STDIO_INSTRUCTION)
    elif not starter_code.strip():
        parts.append(FUNCTION_NO_STARTER_INSTRUCTION.format(fn=fn_name))
    elif solution_class(starter_code):
        parts.append(SOLUTION_INSTRUCTION.format(fn=fn_name))
    else:
        parts.append(FUNCTION_INSTRUCTION.format(fn=fn_name))
    return "\n\n".join(parts) + "\n"


def make_problem(
    ctx: Ctx,
    *,
    task_id: str,
    statement: str,
    starter_code: str,
    test_kind: str,
    fn_name: str,
    public: list[tuple[TestCase, str]],
    hidden: list[tuple[TestCase, str]],
    reference: str,
    source: str,
    split: str,
    prelude: str = "",
    time_limit_s: float | None = None,
    instruction: str = "",
) -> Problem:
    """The Problem of a stdio / call row: `public` (shown, graded with grade_tests="all") and `hidden` tests
    as (TestCase, how the prompt shows it); at least one hidden test."""
    if ctx.max_tests is not None:
        hidden = hidden[: ctx.max_tests]
    if not hidden:
        raise DatasetError(ctx.where, "tests", "no hidden tests", "at least one test the model never sees")
    shown = [s for _, s in public if len(s) <= MAX_EXAMPLE_CHARS]
    shown = shown if ctx.visible_tests is None else shown[: ctx.visible_tests]
    prompt = build_prompt(
        statement,
        test_kind=test_kind,
        fn_name=fn_name,
        starter_code=starter_code,
        examples=tuple(shown),
        instruction=instruction,
    )
    pub = tuple(c for c, _ in public)
    hid = tuple(c for c, _ in hidden)
    graded_public = ctx.grade_tests == "all" and bool(pub)
    setup = call_setup(fn_name, solution_class(starter_code)) if test_kind == "call" else ""
    return Problem(
        task_id=task_id,
        prompt=prompt,
        entry_point=fn_name,
        reference=reference,
        tests=pub + hid if graded_public else hid,
        setup_code=setup,
        completion_mode="program",
        split=split,
        source=source,
        description=statement,
        time_limit_s=time_limit_s,
        test_kind=test_kind,  # type: ignore[arg-type]
        public_tests=pub,
        graded_public=graded_public,
        starter_code=starter_code,
        program_prelude=prelude,
    )


def strip_fence(code: str) -> str:
    """A reference solution stored inside a Markdown code fence (```python ... ```), without the fence."""
    s = code.strip()
    if s.startswith("```"):
        first = s.find("\n")
        body = s[first + 1 :] if first >= 0 else ""
        end = body.rfind("```")
        return (body[:end] if end >= 0 else body).strip("\n") + "\n"
    return code


class Unsupported(DatasetError):
    """A well-formed row this project cannot grade (an interactive problem, a checker that does not compile):
    the loader leaves it out and counts it (`load(..., skipped=...)`), it is not an error of the file."""
