"""Problems from dataset files in the community formats of competitive-programming code RL (stdlib only).

    problems = load("taco_train.jsonl.gz")                        # format detected from the first row
    problems = load("lcb.jsonl", "livecodebench", grade_tests="private", visible_tests=2, max_tests=50)

Formats (docs/DATA_FORMATS.md has every field as read; each converter names the public loader it follows):

* humaneval, mbpp: delegated to `grpo_jax.codegen.datasets.humaneval_problem` / `mbpp_problem` (unchanged);
* apps (also TACO, fmt "taco"): `problem_id`, `question`, `starter_code`, `input_output` (a JSON string of
  {"inputs", "outputs", "fn_name"?}), `solutions` (hendrycks/apps eval/testing_util.py, FlagOpen/TACO
  metrics/testing_util.py);
* codecontests: `name`, `description`, `public_tests` / `private_tests` / `generated_tests` as
  {"input": [...], "output": [...]}, `solutions` (google-deepmind/code_contests contest_problem.proto and the
  Hugging Face deepmind/code_contests layout);
* livecodebench (code_generation_lite): `question_id`, `question_content`, `starter_code`, `metadata`
  ({"func_name"}), `public_test_cases` / `private_test_cases` (LiveCodeBench/LiveCodeBench
  lcb_runner/benchmarks/code_generation.py and lcb_runner/evaluation/testing_util.py);
* native: this project's own JSONL (`task_id`, `statement`, `kind` stdio|call, `fn_name`, `starter_code`,
  `public_tests`, `tests`, `reference`, `split`, `time_limit_s`, `prelude`).

Tests become sandbox `TestCase`s: stdin/stdout tests
`TestCase(call="", kind="stdout", stdin=..., expected=...)`, call-based tests
`TestCase(call="fn(*ARGS)" or "Solution().fn(*ARGS)", kind="json_eq", expected=<JSON data>)`, ARGS
being the argument list as a Python literal (JSON true/false/null -> True/False/None). Problems are in
completion_mode "program"; their prompt is a plain-text user message (`build_prompt`): the statement, the
visible public examples, the starter code and one documented instruction.

Options of `load` (documented in docs/DATA_FORMATS.md):
* grade_tests "all": `Problem.tests` = public + hidden tests; "private": hidden tests only (held-out
  evaluation always grades on the hidden tests: `Problem.with_grade_tests("private")`);
* visible_tests: how many public tests the prompt shows (0: none, the default, since the public datasets'
  statements already contain their examples; None: all);
* max_tests: keep the first N hidden tests (None: all);
* errors: a list to collect the `DatasetError` of each malformed row (skipped) instead of raising the first.

Untrusted pickles: LiveCodeBench's private tests are base64 + zlib + pickle of a JSON string. They are decoded
by `restricted_loads`, an unpickler whose `find_class` refuses every global, so only plain-data opcodes load
and nothing the pickle names is ever called; a result other than a str is refused.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import gzip
import io
import json
import math
import pickle
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_jax.codegen import datasets
from grpo_jax.problem import GRADE_TESTS, Problem, TestCase

__all__ = [
    "APPS_PRELUDE",
    "FORMATS",
    "LCB_PRELUDE",
    "DatasetError",
    "build_prompt",
    "decode_lcb_private",
    "detect_format",
    "load",
    "py_literal",
    "read_rows",
    "restricted_loads",
]

FORMATS: tuple[str, ...] = ("humaneval", "mbpp", "apps", "codecontests", "livecodebench", "native")
ALIASES = {"taco": "apps"}

# The fields that identify a format (the first row's decide; checked in this order).
SIGNATURES: tuple[tuple[str, frozenset[str]], ...] = (
    ("humaneval", frozenset({"task_id", "prompt", "entry_point", "canonical_solution", "test"})),
    ("mbpp", frozenset({"task_id", "text", "code", "test_list"})),
    (
        "livecodebench",
        frozenset({"question_id", "question_content", "public_test_cases", "private_test_cases"}),
    ),
    ("codecontests", frozenset({"name", "description", "public_tests", "private_tests"})),
    ("apps", frozenset({"question", "input_output"})),
    ("native", frozenset({"task_id", "statement", "kind", "tests"})),
)
_SIGNATURE_TEXT = {
    "humaneval": "HumanEval format (task_id, prompt, entry_point, canonical_solution, test)",
    "mbpp": "MBPP format (task_id, text, code, test_list)",
    "livecodebench": "LiveCodeBench format (question_id, question_content, public_test_cases, "
    "private_test_cases)",
    "codecontests": "CodeContests format (name, description, public_tests, private_tests)",
    "apps": "APPS/TACO format (question, input_output)",
    "native": "native format (task_id, statement, kind, tests)",
}

# The import header each format's own grader puts before every program (Problem.program_prelude).
# LiveCodeBench lcb_runner/evaluation/testing_util.py `import_string` (both stdin and call-based programs):
LCB_PRELUDE = """\
from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
import string
import re
import datetime
import collections
import heapq
import bisect
import copy
import math
import random
import statistics
import itertools
import functools
import operator
import io
import sys
import json
sys.setrecursionlimit(50000)
"""
# hendrycks/apps eval/testing_util.py `sol` (FlagOpen/TACO metrics/testing_util.py synthesize_cb_code has the
# same), less its `import numpy as np` line: the sandbox's programs are plain Python.
APPS_PRELUDE = """\
import sys
import time
import itertools
from itertools import accumulate, product, permutations, combinations
import collections
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache
import math
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
import fractions
from typing import List, Tuple
import random
import heapq
from heapq import *
"""

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
MAX_DECODED_BYTES = 1 << 30  # LiveCodeBench private tests: the most a zlib stream may inflate to


class DatasetError(ValueError):
    """One malformed row (or file): `where` is "PATH:LINE" ("PATH:item N" in a JSON list), `field` the field
    at fault; the message says what was wrong and what is valid."""

    def __init__(self, where: str, field: str, what: str, valid: str = ""):
        self.where, self.field = where, field
        super().__init__(f"{where}: {field}: {what}" + (f"; valid: {valid}" if valid else ""))


# ------------------------------------------------------------------------------------------------------------
# Reading rows
# ------------------------------------------------------------------------------------------------------------
def read_rows(path: str | Path) -> Iterator[tuple[str, int, dict | DatasetError]]:
    """(where, index, row) per problem of a .jsonl / .jsonl.gz file (one JSON object a line, blank lines
    skipped; read as a stream) or of a file whose first non-blank character is "[" (a .json / .json.gz list
    of objects). `where` is "PATH:LINE" ("PATH:item N" in a list), `index` counts problem rows from 0; a row
    that is not a JSON object comes as a DatasetError in its place (the caller raises or skips it)."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            index = 0
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if index == 0 and line.lstrip().startswith("["):
                    yield from _json_list(path, line + f.read(), lineno)
                    return
                where = f"{path}:{lineno}"
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as e:
                    msg = (
                        f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else "too deep"
                    )
                    row = DatasetError(where, "line", f"not JSON ({msg})", "one JSON object a line")
                else:
                    if not isinstance(row, dict):
                        row = DatasetError(
                            where, "line", f"a JSON {type(row).__name__}", "one JSON object a line"
                        )
                yield where, index, row
                index += 1
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DatasetError(
            str(path), "file", f"unreadable ({type(e).__name__}: {e})", "UTF-8 JSONL"
        ) from None


def _json_list(path: Path, text: str, first_line: int) -> Iterator[tuple[str, int, dict | DatasetError]]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        where = f"{path}:{first_line + e.lineno - 1}"
        raise DatasetError(where, "file", f"not JSON ({e.msg})", "a JSON list of objects, or JSONL") from None
    if not isinstance(rows, list):
        raise DatasetError(
            f"{path}:{first_line}", "file", "not a JSON list", "a JSON list of objects, or JSONL"
        )
    for i, row in enumerate(rows):
        where = f"{path}:item {i + 1}"
        if not isinstance(row, dict):
            yield where, i, DatasetError(where, "item", f"a JSON {type(row).__name__}", "a JSON object")
        else:
            yield where, i, row


def detect_format(row: dict) -> str | None:
    """The format whose identifying fields the row has (SIGNATURES, in order), or None."""
    for name, fields in SIGNATURES:
        if fields <= row.keys():
            return name
    return None


# ------------------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Ctx:
    where: str
    index: int
    grade_tests: str
    visible_tests: int | None
    max_tests: int | None


def load(
    path: str | Path,
    fmt: str | None = None,
    *,
    grade_tests: str = "all",
    visible_tests: int | None = 0,
    max_tests: int | None = None,
    errors: list | None = None,
) -> list[Problem]:
    """The problems of a dataset file, in file order.

    fmt: one of FORMATS (or "taco" = "apps"); None: detected from the first row's fields. HumanEval / MBPP
    files keep their old behaviour (each row may be either). grade_tests: "all" (public + hidden tests grade)
    or "private" (hidden only). visible_tests: public examples shown in the prompt (0 none, N the first N,
    None all). max_tests: keep the first N hidden tests. errors: None raises the first malformed row's
    DatasetError; a list collects one DatasetError per malformed row and skips the row. Task ids must be
    unique (apps / codecontests / livecodebench / native)."""
    if grade_tests not in GRADE_TESTS:
        raise ValueError(f"grade_tests={grade_tests!r}; valid: {', '.join(GRADE_TESTS)}")
    if visible_tests is not None and (isinstance(visible_tests, bool) or visible_tests < 0):
        raise ValueError(f"visible_tests={visible_tests!r}; valid: an integer >= 0 or None (all)")
    if max_tests is not None and (isinstance(max_tests, bool) or max_tests < 1):
        raise ValueError(f"max_tests={max_tests!r}; valid: an integer >= 1 or None (all)")
    if fmt is not None:
        name = ALIASES.get(fmt, fmt)
        if name not in FORMATS:
            raise ValueError(f"fmt={fmt!r}; valid: {', '.join(FORMATS)} (or taco = apps), or None to detect")
        fmt = name
    legacy = False
    out: list[Problem] = []
    seen: dict[str, str] = {}
    for where, index, row in read_rows(path):
        try:
            if isinstance(row, DatasetError):
                raise row
            if fmt is None:
                fmt = detect_format(row)
                if fmt is None:
                    raise DatasetError(
                        where,
                        "fields",
                        "neither " + " nor ".join(_SIGNATURE_TEXT[n] for n, _ in SIGNATURES),
                        f"one of those sets of fields, or name the format: fmt= one of {', '.join(FORMATS)}",
                    )
                legacy = fmt in ("humaneval", "mbpp")
            ctx = _Ctx(where, index, grade_tests, visible_tests, max_tests)
            prob = (
                _legacy(row, ctx, None if legacy else fmt)
                if fmt in ("humaneval", "mbpp")
                else _CONVERT[fmt](row, ctx)
            )
            if fmt not in ("humaneval", "mbpp"):
                if prob.task_id in seen:
                    raise DatasetError(
                        where, "task_id", f"{prob.task_id!r} already at {seen[prob.task_id]}", "unique ids"
                    )
                seen[prob.task_id] = where
        except DatasetError as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        out.append(prob)
    if not out and not errors:
        raise ValueError(f"{path}: no problems")
    return out


def _legacy(row: dict, ctx: _Ctx, fmt: str | None) -> Problem:
    """HumanEval / MBPP rows through grpo_jax.codegen.datasets (fmt None: either, decided per row)."""
    he = {"task_id", "prompt", "entry_point", "canonical_solution", "test"}
    mb = {"task_id", "text", "code", "test_list"}
    if fmt in (None, "humaneval") and he <= row.keys():
        fn = datasets.humaneval_problem
    elif fmt in (None, "mbpp") and mb <= row.keys():
        fn = datasets.mbpp_problem
    else:
        want = [n for n in ("humaneval", "mbpp") if fmt in (None, n)]
        missing = sorted(((he if fmt == "humaneval" else mb) - row.keys()) if fmt else set())
        raise DatasetError(
            ctx.where,
            ", ".join(missing) if missing else "fields",
            "missing" if missing else "neither " + " nor ".join(_SIGNATURE_TEXT[n] for n in want),
            " / ".join(_SIGNATURE_TEXT[n] for n in want),
        )
    try:
        return fn(row)
    except (KeyError, TypeError, ValueError, AttributeError, SyntaxError) as e:
        raise DatasetError(
            ctx.where, "row", f"{type(e).__name__}: {e}", _SIGNATURE_TEXT[fmt or "mbpp"]
        ) from None


# ------------------------------------------------------------------------------------------------------------
# Field helpers
# ------------------------------------------------------------------------------------------------------------
def _need(row: dict, field: str, ctx: _Ctx, valid: str):
    if field not in row or row[field] is None:
        raise DatasetError(ctx.where, field, "missing", valid)
    return row[field]


def _text(row: dict, field: str, ctx: _Ctx, *, required: bool = True, nonempty: bool = False) -> str:
    if not required and row.get(field) is None:
        return ""
    v = _need(row, field, ctx, "a string")
    if not isinstance(v, str):
        raise DatasetError(ctx.where, field, f"a JSON {type(v).__name__}", "a string")
    if nonempty and not v.strip():
        raise DatasetError(ctx.where, field, "empty", "a non-empty string")
    return v


def _task_id(row: dict, field: str, ctx: _Ctx) -> str:
    v = _need(row, field, ctx, "a string or an integer")
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, str) and not v.strip()):
        raise DatasetError(ctx.where, field, f"{v!r}", "a non-empty string or an integer")
    return str(v)


def _fn_name(v: Any, ctx: _Ctx, field: str) -> str:
    if not isinstance(v, str) or not v.isidentifier():
        raise DatasetError(ctx.where, field, f"{v!r} is not a function name", "a Python identifier")
    return v


def _json_field(v: Any, ctx: _Ctx, field: str, valid: str) -> Any:
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except (json.JSONDecodeError, RecursionError) as e:
        raise DatasetError(ctx.where, field, f"not JSON ({getattr(e, 'msg', e)})", valid) from None


def _solution_class(starter_code: str) -> bool:
    """LeetCode style: the tests call `Solution().fn(...)`. The graders (APPS, TACO, LiveCodeBench
    compile_code) decide from `"class Solution" in code`; here the starter code decides, once per problem."""
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


def _int_keys(d: dict) -> dict:
    """APPS/TACO testing_util: "JSON forces dictionaries to have string keys; this undoes this" (when every
    key converts; otherwise the dict is kept as it is, as their try/except does)."""
    try:
        return {int(k): v for k, v in d.items()}
    except (ValueError, TypeError):
        return d


def _stdio_test(stdin: str, expected: str, label: str) -> tuple[TestCase, str]:
    case = TestCase(call="", kind="stdout", stdin=stdin, expected=expected, source=label)
    shown = f"Input:\n```\n{stdin.rstrip()}\n```\nOutput:\n```\n{expected.rstrip()}\n```"
    return case, shown


def _call_test(
    fn: str, solution_class: bool, args: list, expected: Any, label: str, ctx: _Ctx, field: str
) -> tuple[TestCase, str]:
    target = f"Solution().{fn}" if solution_class else fn
    try:
        args_text = py_literal(list(args))
        shown_args = ", ".join(py_literal(a) for a in args)
        shown_out = py_literal(expected)
    except (TypeError, RecursionError) as e:
        raise DatasetError(ctx.where, field, str(e) or "nested too deeply", "JSON data") from None
    case = TestCase(call=f"{target}(*{args_text})", expected=expected, kind="json_eq", source=label)
    return case, f">>> {target}({shown_args})\n{shown_out}"


def build_prompt(
    statement: str,
    *,
    test_kind: str,
    fn_name: str = "",
    starter_code: str = "",
    examples: tuple[str, ...] = (),
) -> str:
    """The plain-text user message of a stdio / call problem: the statement, the shown examples, the starter
    code in a ```python block, then the instruction (STDIO_INSTRUCTION; FUNCTION_INSTRUCTION,
    SOLUTION_INSTRUCTION for a `class Solution` starter, FUNCTION_NO_STARTER_INSTRUCTION). The model's chat
    template (if any) is applied by grpo_jax.codegen.pipeline.render_prompt."""
    parts = [statement.strip()]
    if examples:
        parts.append(
            "Examples:\n\n" if len(examples) > 1 else "Example:\n\n",
        )
        parts[-1] += "\n\n".join(examples)
    if starter_code.strip():
        parts.append(f"Starter code:\n```python\n{starter_code.rstrip()}\n```")
    if test_kind == "stdio":
        parts.append(STDIO_INSTRUCTION)
    elif not starter_code.strip():
        parts.append(FUNCTION_NO_STARTER_INSTRUCTION.format(fn=fn_name))
    elif _solution_class(starter_code):
        parts.append(SOLUTION_INSTRUCTION.format(fn=fn_name))
    else:
        parts.append(FUNCTION_INSTRUCTION.format(fn=fn_name))
    return "\n\n".join(parts) + "\n"


def _problem(
    ctx: _Ctx,
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
) -> Problem:
    if ctx.max_tests is not None:
        hidden = hidden[: ctx.max_tests]
    if not hidden:
        raise DatasetError(ctx.where, "tests", "no hidden tests", "at least one test the model never sees")
    shown = [s for _, s in public if len(s) <= MAX_EXAMPLE_CHARS]
    shown = shown if ctx.visible_tests is None else shown[: ctx.visible_tests]
    prompt = build_prompt(
        statement, test_kind=test_kind, fn_name=fn_name, starter_code=starter_code, examples=tuple(shown)
    )
    pub = tuple(c for c, _ in public)
    hid = tuple(c for c, _ in hidden)
    graded_public = ctx.grade_tests == "all" and bool(pub)
    return Problem(
        task_id=task_id,
        prompt=prompt,
        entry_point=fn_name,
        reference=reference,
        tests=pub + hid if graded_public else hid,
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


# ------------------------------------------------------------------------------------------------------------
# APPS / TACO
# ------------------------------------------------------------------------------------------------------------
_APPS_IO = 'a JSON string {"inputs": [...], "outputs": [...], "fn_name"?: str}'


def _apps(row: dict, ctx: _Ctx) -> Problem:
    """hendrycks/apps eval/testing_util.py run_test and FlagOpen/TACO metrics/testing_util.py run_test /
    process_input_output / execute_cb_code / execute_std_code:

    * call-based iff input_output has a non-empty fn_name (testing_util: `fn_name is None`; APPS's
      generate_gpt_codes.py prompt: `not fn_name`, so "" is standard input here too);
    * call-based: inputs[i] is the argument list (`method(*inputs)`), a first dict argument gets int keys;
      outputs[i] is compared as `out == outputs[i] or out == outputs[i][0]` (outputs are usually wrapped in
      a one-element list): the expected value is outputs[i][0] for a one-element list, else outputs[i]
      (a dict gets int keys); a tuple result counts as a list (the sandbox's json_eq);
    * standard input: inputs[i] / outputs[i] are strings, or lists of lines joined with "\\n";
    * every test is hidden (APPS / TACO have no public tests; the question shows its examples);
    * task_id: problem_id (APPS); a TACO row has none: its 0-based position in the file (TACO's
      generation.py numbers problems so); source "apps" with a problem_id, else "taco";
    * reference: the first of `solutions` (a JSON string list), if any.
    """
    question = _text(row, "question", ctx, nonempty=True)
    starter = _text(row, "starter_code", ctx, required=False)
    if "problem_id" in row and row["problem_id"] is not None:
        task_id, source = _task_id(row, "problem_id", ctx), "apps"
    else:
        task_id, source = str(ctx.index), "taco"
    raw = _need(row, "input_output", ctx, _APPS_IO)
    if isinstance(raw, str) and not raw.strip():
        raise DatasetError(ctx.where, "input_output", "empty (the problem has no tests)", _APPS_IO)
    io_ = _json_field(raw, ctx, "input_output", _APPS_IO)
    if (
        not isinstance(io_, dict)
        or not isinstance(io_.get("inputs"), list)
        or not isinstance(io_.get("outputs"), list)
    ):
        raise DatasetError(ctx.where, "input_output", "not an object with lists inputs and outputs", _APPS_IO)
    inputs, outputs = io_["inputs"], io_["outputs"]
    if len(inputs) != len(outputs):
        raise DatasetError(
            ctx.where, "input_output", f"{len(inputs)} inputs but {len(outputs)} outputs", "as many of each"
        )
    fn = io_.get("fn_name")
    hidden = []
    if fn is None or fn == "":
        kind, fn = "stdio", ""
        for i, (inp, out) in enumerate(zip(inputs, outputs, strict=True)):
            stdin = _lines(inp, ctx, f"input_output.inputs[{i}]")
            expected = _lines(out, ctx, f"input_output.outputs[{i}]")
            hidden.append(_stdio_test(stdin, expected, f"test {i}"))
    else:
        kind = "call"
        fn = _fn_name(fn, ctx, "input_output.fn_name")
        cls = _solution_class(starter)
        for i, (args, out) in enumerate(zip(inputs, outputs, strict=True)):
            if not isinstance(args, list):
                raise DatasetError(
                    ctx.where,
                    f"input_output.inputs[{i}]",
                    f"a JSON {type(args).__name__}",
                    "the argument list",
                )
            if args and isinstance(args[0], dict):
                args = [_int_keys(args[0]), *args[1:]]
            if isinstance(out, dict):
                out = _int_keys(out)
            elif isinstance(out, list) and len(out) == 1:
                out = _int_keys(out[0]) if isinstance(out[0], dict) else out[0]
            hidden.append(_call_test(fn, cls, args, out, f"test {i}", ctx, f"input_output.outputs[{i}]"))
    return _problem(
        ctx,
        task_id=task_id,
        statement=question,
        starter_code=starter,
        test_kind=kind,
        fn_name=fn,
        public=[],
        hidden=hidden,
        reference=_first_solution(row, ctx),
        source=source,
        split="train",
        prelude=APPS_PRELUDE,
    )


def _lines(v: Any, ctx: _Ctx, field: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "\n".join(v)
    raise DatasetError(ctx.where, field, f"a JSON {type(v).__name__}", "a string or a list of lines")


def _first_solution(row: dict, ctx: _Ctx) -> str:
    raw = row.get("solutions")
    if raw is None or raw == "":
        return ""
    sols = _json_field(raw, ctx, "solutions", "a JSON string list of programs")
    if not isinstance(sols, list) or not all(isinstance(s, str) for s in sols):
        raise DatasetError(ctx.where, "solutions", "not a list of strings", "a JSON string list of programs")
    return sols[0] if sols else ""


# ------------------------------------------------------------------------------------------------------------
# CodeContests
# ------------------------------------------------------------------------------------------------------------
_CC_TESTS = '{"input": [str, ...], "output": [str, ...]} (or a list of {"input": str, "output": str})'
PYTHON3 = 3  # contest_problem.proto Solution.Language.PYTHON3


def _codecontests(row: dict, ctx: _Ctx) -> Problem:
    """google-deepmind/code_contests contest_problem.proto (ContestProblem) as the Hugging Face
    deepmind/code_contests rows lay it out: `name` (the task id), `description`, `public_tests` (visible),
    `private_tests` + `generated_tests` (hidden, in that order), each {"input": [...], "output": [...]};
    every test is stdin/stdout. `solutions` {"language": [...], "solution": [...]}: the first PYTHON3 (3) one
    is the reference. A problem that reads `input_file` / writes `output_file` cannot be graded here."""
    name = _text(row, "name", ctx, nonempty=True)
    description = _text(row, "description", ctx, nonempty=True)
    for f in ("input_file", "output_file"):
        if row.get(f):
            raise DatasetError(
                ctx.where, f, f"{row[f]!r} (file I/O)", "empty: problems on stdin / stdout only"
            )
    public = _cc_tests(row, "public_tests", ctx, "public")
    hidden = _cc_tests(row, "private_tests", ctx, "private") + _cc_tests(
        row, "generated_tests", ctx, "generated"
    )
    reference = ""
    sols = row.get("solutions")
    if (
        isinstance(sols, dict)
        and isinstance(sols.get("language"), list)
        and isinstance(sols.get("solution"), list)
    ):
        for lang, code in zip(sols["language"], sols["solution"], strict=False):
            if lang == PYTHON3 and isinstance(code, str):
                reference = code
                break
    elif sols not in (None, "", [], {}):
        raise DatasetError(
            ctx.where, "solutions", "malformed", '{"language": [int, ...], "solution": [str, ...]}'
        )
    return _problem(
        ctx,
        task_id=name,
        statement=description,
        starter_code="",
        test_kind="stdio",
        fn_name="",
        public=public,
        hidden=hidden,
        reference=reference,
        source="codecontests",
        split="train",
    )


def _cc_tests(row: dict, field: str, ctx: _Ctx, label: str) -> list[tuple[TestCase, str]]:
    v = row.get(field)
    if v is None:
        return []
    if isinstance(v, list):  # the proto's repeated Test as JSON
        if not all(isinstance(t, dict) for t in v):
            raise DatasetError(ctx.where, field, "a list of non-objects", _CC_TESTS)
        ins, outs = [t.get("input") for t in v], [t.get("output") for t in v]
    elif isinstance(v, dict):
        ins, outs = v.get("input", []), v.get("output", [])
    else:
        raise DatasetError(ctx.where, field, f"a JSON {type(v).__name__}", _CC_TESTS)
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        raise DatasetError(ctx.where, field, "input and output are not lists of one length", _CC_TESTS)
    out = []
    for i, (a, b) in enumerate(zip(ins, outs, strict=True)):
        if not isinstance(a, str) or not isinstance(b, str):
            raise DatasetError(ctx.where, f"{field}[{i}]", "input / output not strings", _CC_TESTS)
        out.append(_stdio_test(a, b, f"{label} {i}"))
    return out


# ------------------------------------------------------------------------------------------------------------
# LiveCodeBench
# ------------------------------------------------------------------------------------------------------------
_LCB_TESTS = 'a JSON string list of {"input": str, "output": str, "testtype": "stdin" | "functional"}'
_LCB_PRIVATE = _LCB_TESTS + ", or base64(zlib(pickle(that JSON string)))"


class _DataOnlyUnpickler(pickle.Unpickler):
    """Refuses every global (so no class, function or reducer can be named, hence nothing called) and every
    persistent id: only plain-data opcodes (str, bytes, int, float, list, dict, tuple, ...) load."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused persistent id")


def restricted_loads(data: bytes) -> str:
    """Unpickle untrusted bytes that must hold one str (LiveCodeBench's pickled JSON string). Never runs
    code the pickle names; anything but a str is refused. Raises pickle.UnpicklingError."""
    try:
        value = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError:
        raise
    except Exception as e:  # truncated / malformed streams raise EOFError, ValueError, KeyError, ...
        raise pickle.UnpicklingError(f"malformed pickle ({type(e).__name__}: {e})") from None
    if type(value) is not str:
        raise pickle.UnpicklingError(f"the pickle holds a {type(value).__name__}, not a str")
    return value


def decode_lcb_private(text: str) -> Any:
    """LiveCodeBench code_generation.py: `json.loads(private_test_cases)`, else
    `json.loads(pickle.loads(zlib.decompress(base64.b64decode(...))))` — with `restricted_loads` for the
    pickle, and the inflated size capped at MAX_DECODED_BYTES. Raises ValueError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        packed = base64.b64decode(text.encode("utf-8"))
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"neither JSON nor base64 ({e})") from None
    z = zlib.decompressobj()
    try:
        raw = z.decompress(packed, MAX_DECODED_BYTES)
    except zlib.error as e:
        raise ValueError(f"not zlib data ({e})") from None
    if z.unconsumed_tail:
        raise ValueError(f"inflates to more than {MAX_DECODED_BYTES} bytes")
    try:
        inner = restricted_loads(raw)
    except pickle.UnpicklingError as e:
        raise ValueError(f"refused pickle: {e}") from None
    try:
        return json.loads(inner)
    except json.JSONDecodeError as e:
        raise ValueError(f"the pickled string is not JSON ({e.msg})") from None


def _livecodebench(row: dict, ctx: _Ctx) -> Problem:
    """LiveCodeBench lcb_runner/benchmarks/code_generation.py (CodeGenerationProblem, Test) and
    lcb_runner/evaluation/testing_util.py (run_test, grade_call_based, grade_stdio):

    * `question_id` is the task id, `question_content` the statement (LCB's prompts show no title),
      `starter_code` the starter code; `metadata` a JSON string whose `func_name` makes the problem
      call-based (get_evaluation_sample's fn_name), else stdin/stdout;
    * `public_test_cases`: a JSON string list of {"input", "output", "testtype"} (testtype "stdin" or
      "functional", as TestType() accepts); `private_test_cases`: the same, or base64 + zlib + pickle of that
      JSON string (decoded with `restricted_loads`, never plain pickle);
    * call-based: each line of `input` is one JSON argument (`[json.loads(line) for line in
      input.split("\\n")]`), `output` one JSON value; `Solution().fn(...)` when the starter code has
      `class Solution` (compile_code's test), else `fn(...)`;
    * programs get LCB's `import_string` before them (LCB_PRELUDE); split "test" (LCB is a benchmark).
    """
    task_id = _task_id(row, "question_id", ctx)
    content = _text(row, "question_content", ctx, nonempty=True)
    starter = _text(row, "starter_code", ctx, required=False)
    meta = row.get("metadata")
    meta = (
        {} if meta in (None, "") else _json_field(meta, ctx, "metadata", 'a JSON string {"func_name"?: str}')
    )
    if not isinstance(meta, dict):
        raise DatasetError(
            ctx.where, "metadata", f"a JSON {type(meta).__name__}", 'a JSON object {"func_name"?}'
        )
    fn = meta.get("func_name")
    kind = "stdio" if fn is None else "call"
    fn = "" if fn is None else _fn_name(fn, ctx, "metadata.func_name")
    cls = _solution_class(starter)

    raw_pub = _need(row, "public_test_cases", ctx, _LCB_TESTS)
    public = _json_field(raw_pub, ctx, "public_test_cases", _LCB_TESTS)
    raw_priv = _need(row, "private_test_cases", ctx, _LCB_PRIVATE)
    if isinstance(raw_priv, str):
        try:
            private = decode_lcb_private(raw_priv)
        except ValueError as e:
            raise DatasetError(ctx.where, "private_test_cases", str(e), _LCB_PRIVATE) from None
    else:
        private = raw_priv
    tests = []
    for field, items, label in (
        ("public_test_cases", public, "public"),
        ("private_test_cases", private, "private"),
    ):
        if not isinstance(items, list):
            raise DatasetError(ctx.where, field, f"a JSON {type(items).__name__}", _LCB_TESTS)
        out = []
        for i, t in enumerate(items):
            f = f"{field}[{i}]"
            if (
                not isinstance(t, dict)
                or not isinstance(t.get("input"), str)
                or not isinstance(t.get("output"), str)
            ):
                raise DatasetError(ctx.where, f, "not {input: str, output: str, testtype}", _LCB_TESTS)
            if t.get("testtype") not in ("stdin", "functional"):
                raise DatasetError(
                    ctx.where, f + ".testtype", repr(t.get("testtype")), '"stdin" or "functional"'
                )
            if kind == "stdio":
                out.append(_stdio_test(t["input"], t["output"], f"{label} {i}"))
                continue
            try:
                args = [json.loads(line) for line in t["input"].split("\n")]
            except json.JSONDecodeError as e:
                raise DatasetError(
                    ctx.where, f + ".input", f"a line is not JSON ({e.msg})", "one JSON value a line"
                ) from None
            expected = _json_field(t["output"], ctx, f + ".output", "one JSON value")
            out.append(_call_test(fn, cls, args, expected, f"{label} {i}", ctx, f))
        tests.append(out)
    return _problem(
        ctx,
        task_id=task_id,
        statement=content,
        starter_code=starter,
        test_kind=kind,
        fn_name=fn,
        public=tests[0],
        hidden=tests[1],
        reference="",
        source="livecodebench",
        split="test",
        prelude=LCB_PRELUDE,
    )


# ------------------------------------------------------------------------------------------------------------
# Native
# ------------------------------------------------------------------------------------------------------------
_NATIVE_TEST = {
    "stdio": '{"input": str, "output": str}',
    "call": '{"args": [JSON, ...], "output": JSON}',
}


def _native(row: dict, ctx: _Ctx) -> Problem:
    """This project's JSONL (docs/DATA_FORMATS.md): task_id, statement, kind "stdio" | "call", fn_name (call),
    starter_code, public_tests, tests (hidden, at least one), reference, split, time_limit_s, prelude."""
    task_id = _task_id(row, "task_id", ctx)
    statement = _text(row, "statement", ctx, nonempty=True)
    kind = row.get("kind")
    if kind not in _NATIVE_TEST:
        raise DatasetError(ctx.where, "kind", repr(kind), '"stdio" or "call"')
    starter = _text(row, "starter_code", ctx, required=False)
    fn = _fn_name(_need(row, "fn_name", ctx, "a Python identifier"), ctx, "fn_name") if kind == "call" else ""
    cls = _solution_class(starter)
    split = _text(row, "split", ctx, required=False) or "train"
    tl = row.get("time_limit_s")
    if tl is not None and (isinstance(tl, bool) or not isinstance(tl, (int, float)) or not tl > 0):
        raise DatasetError(ctx.where, "time_limit_s", repr(tl), "a number of seconds > 0")
    groups = []
    for field, label in (("public_tests", "public"), ("tests", "private")):
        items = row.get(field) if field == "public_tests" else _need(row, field, ctx, "a list")
        items = [] if items is None else items
        if not isinstance(items, list):
            raise DatasetError(
                ctx.where, field, f"a JSON {type(items).__name__}", "a list of " + _NATIVE_TEST[kind]
            )
        out = []
        for i, t in enumerate(items):
            f = f"{field}[{i}]"
            if not isinstance(t, dict) or "output" not in t:
                raise DatasetError(ctx.where, f, "malformed", _NATIVE_TEST[kind])
            if kind == "stdio":
                if not isinstance(t.get("input"), str) or not isinstance(t["output"], str):
                    raise DatasetError(ctx.where, f, "input / output not strings", _NATIVE_TEST[kind])
                out.append(_stdio_test(t["input"], t["output"], f"{label} {i}"))
            else:
                if not isinstance(t.get("args"), list):
                    raise DatasetError(ctx.where, f + ".args", "not a list", _NATIVE_TEST[kind])
                out.append(_call_test(fn, cls, t["args"], t["output"], f"{label} {i}", ctx, f))
        groups.append(out)
    return _problem(
        ctx,
        task_id=task_id,
        statement=statement,
        starter_code=starter,
        test_kind=kind,
        fn_name=fn,
        public=groups[0],
        hidden=groups[1],
        reference=_text(row, "reference", ctx, required=False),
        source="native",
        split=split,
        prelude=_text(row, "prelude", ctx, required=False),
        time_limit_s=float(tl) if tl is not None else None,
    )


_CONVERT = {
    "apps": _apps,
    "codecontests": _codecontests,
    "livecodebench": _livecodebench,
    "native": _native,
}
