"""LiveCodeBench (`livecodebench`, code_generation_lite): LiveCodeBench/LiveCodeBench
lcb_runner/benchmarks/code_generation.py (CodeGenerationProblem, Test) and
lcb_runner/evaluation/testing_util.py.

Untrusted pickles: LiveCodeBench's private tests are base64 + zlib + pickle of a JSON string. They are decoded
by `restricted_loads`, an unpickler whose `find_class` refuses every global, so only plain-data opcodes load
and nothing the pickle names is ever called; a result other than a str is refused.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from typing import Any

from grpo_jax.data import common as c
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem

MAX_DECODED_BYTES = 1 << 30  # LiveCodeBench private tests: the most a zlib stream may inflate to

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


def functional_test(fn: str, cls: bool, t: dict, label: str, ctx: c.Ctx, field: str) -> tuple:
    """A functional test {"input": str, "output": str} as LiveCodeBench reads it: each line of `input` one
    JSON argument, `output` one JSON value (also DeepCoder's lcbv5 layout)."""
    try:
        args = [json.loads(line) for line in t["input"].split("\n")]
    except json.JSONDecodeError as e:
        raise c.DatasetError(
            ctx.where, field + ".input", f"a line is not JSON ({e.msg})", "one JSON value a line"
        ) from None
    expected = c.json_field(t["output"], ctx, field + ".output", "one JSON value")
    return c.call_test(fn, cls, args, expected, label, ctx, field)


def convert(row: dict, ctx: c.Ctx) -> Problem:
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
    task_id = c.task_id(row, "question_id", ctx)
    content = c.text(row, "question_content", ctx, nonempty=True)
    starter = c.text(row, "starter_code", ctx, required=False)
    meta = row.get("metadata")
    meta = (
        {} if meta in (None, "") else c.json_field(meta, ctx, "metadata", 'a JSON string {"func_name"?: str}')
    )
    if not isinstance(meta, dict):
        raise c.DatasetError(
            ctx.where, "metadata", f"a JSON {type(meta).__name__}", 'a JSON object {"func_name"?}'
        )
    fn = meta.get("func_name")
    kind = "stdio" if fn is None else "call"
    fn = "" if fn is None else c.fn_name(fn, ctx, "metadata.func_name")
    cls = c.solution_class(starter)

    raw_pub = c.need(row, "public_test_cases", ctx, _LCB_TESTS)
    public = c.json_field(raw_pub, ctx, "public_test_cases", _LCB_TESTS)
    raw_priv = c.need(row, "private_test_cases", ctx, _LCB_PRIVATE)
    if isinstance(raw_priv, str):
        try:
            private = decode_lcb_private(raw_priv)
        except ValueError as e:
            raise c.DatasetError(ctx.where, "private_test_cases", str(e), _LCB_PRIVATE) from None
    else:
        private = raw_priv
    tests = []
    for field, items, label in (
        ("public_test_cases", public, "public"),
        ("private_test_cases", private, "private"),
    ):
        if not isinstance(items, list):
            raise c.DatasetError(ctx.where, field, f"a JSON {type(items).__name__}", _LCB_TESTS)
        out = []
        for i, t in enumerate(items):
            f = f"{field}[{i}]"
            if (
                not isinstance(t, dict)
                or not isinstance(t.get("input"), str)
                or not isinstance(t.get("output"), str)
            ):
                raise c.DatasetError(ctx.where, f, "not {input: str, output: str, testtype}", _LCB_TESTS)
            if t.get("testtype") not in ("stdin", "functional"):
                raise c.DatasetError(
                    ctx.where, f + ".testtype", repr(t.get("testtype")), '"stdin" or "functional"'
                )
            if kind == "stdio":
                out.append(c.stdio_test(t["input"], t["output"], f"{label} {i}"))
            else:
                out.append(functional_test(fn, cls, t, f"{label} {i}", ctx, f))
        tests.append(out)
    return c.make_problem(
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


FORMAT = register(
    Format(
        name="livecodebench",
        signature=("question_id", "question_content", "public_test_cases", "private_test_cases"),
        description="LiveCodeBench format",
        follows="LiveCodeBench lcb_runner/benchmarks/code_generation.py, evaluation/testing_util.py",
        convert=convert,
        order=20,
        difficulty=lambda row: row.get("difficulty"),
    )
)
