"""APPS and TACO (`apps`, alias `taco`): hendrycks/apps and FlagOpen/TACO rows (`problem_id`, `question`,
`starter_code`, `input_output` (a JSON string {"inputs", "outputs", "fn_name"?}), `solutions`), as their
graders read them (hendrycks/apps eval/testing_util.py, FlagOpen/TACO metrics/testing_util.py).
"""

from __future__ import annotations

from grpo_jax.data import common as c
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem

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


_APPS_IO = 'a JSON string {"inputs": [...], "outputs": [...], "fn_name"?: str}'


def convert(row: dict, ctx: c.Ctx) -> Problem:
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
    question = c.text(row, "question", ctx, nonempty=True)
    starter = c.text(row, "starter_code", ctx, required=False)
    if "problem_id" in row and row["problem_id"] is not None:
        task_id, source = c.task_id(row, "problem_id", ctx), "apps"
    else:
        task_id, source = str(ctx.index), "taco"
    raw = c.need(row, "input_output", ctx, _APPS_IO)
    if isinstance(raw, str) and not raw.strip():
        raise c.DatasetError(ctx.where, "input_output", "empty (the problem has no tests)", _APPS_IO)
    io_ = c.json_field(raw, ctx, "input_output", _APPS_IO)
    if (
        not isinstance(io_, dict)
        or not isinstance(io_.get("inputs"), list)
        or not isinstance(io_.get("outputs"), list)
    ):
        raise c.DatasetError(
            ctx.where, "input_output", "not an object with lists inputs and outputs", _APPS_IO
        )
    inputs, outputs = io_["inputs"], io_["outputs"]
    if len(inputs) != len(outputs):
        raise c.DatasetError(
            ctx.where, "input_output", f"{len(inputs)} inputs but {len(outputs)} outputs", "as many of each"
        )
    fn = io_.get("fn_name")
    if fn is None or fn == "":
        kind, fn = "stdio", ""
        hidden = stdio_tests(inputs, outputs, ctx, "input_output")
    else:
        kind = "call"
        fn = c.fn_name(fn, ctx, "input_output.fn_name")
        hidden = call_tests(fn, c.solution_class(starter), inputs, outputs, ctx, "input_output")
    return c.make_problem(
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


def stdio_tests(inputs: list, outputs: list, ctx: c.Ctx, field: str, label: str = "test") -> list:
    """APPS / TACO standard-input tests: inputs[i] / outputs[i] strings or lists of lines."""
    out = []
    for i, (inp, exp) in enumerate(zip(inputs, outputs, strict=True)):
        stdin = c.lines(inp, ctx, f"{field}.inputs[{i}]")
        expected = c.lines(exp, ctx, f"{field}.outputs[{i}]")
        out.append(c.stdio_test(stdin, expected, f"{label} {i}"))
    return out


def call_tests(
    fn: str,
    cls: bool,
    inputs: list,
    outputs: list,
    ctx: c.Ctx,
    field: str,
    label: str = "test",
    json_strings: bool = False,
) -> list:
    """APPS / TACO call-based tests (testing_util's conventions, see `convert`): inputs[i] the argument list,
    a first dict argument with int keys; outputs[i] unwrapped from a one-element list. json_strings: inputs
    and outputs may be JSON strings of those (SYNTHETIC-1, DeepCoder), parsed first."""
    out = []
    for i, (args, exp) in enumerate(zip(inputs, outputs, strict=True)):
        if json_strings:
            args = c.json_field(args, ctx, f"{field}[{i}].input", "the argument list (JSON)")
            exp = c.json_field(exp, ctx, f"{field}[{i}].output", "JSON data")
        if not isinstance(args, list):
            raise c.DatasetError(
                ctx.where, f"{field}.inputs[{i}]", f"a JSON {type(args).__name__}", "the argument list"
            )
        if args and isinstance(args[0], dict):
            args = [c.int_keys(args[0]), *args[1:]]
        if isinstance(exp, dict):
            exp = c.int_keys(exp)
        elif isinstance(exp, list) and len(exp) == 1:
            exp = c.int_keys(exp[0]) if isinstance(exp[0], dict) else exp[0]
        out.append(c.call_test(fn, cls, args, exp, f"{label} {i}", ctx, f"{field}.outputs[{i}]"))
    return out


def _first_solution(row: dict, ctx: c.Ctx) -> str:
    raw = row.get("solutions")
    if raw is None or raw == "":
        return ""
    sols = c.json_field(raw, ctx, "solutions", "a JSON string list of programs")
    if not isinstance(sols, list) or not all(isinstance(s, str) for s in sols):
        raise c.DatasetError(
            ctx.where, "solutions", "not a list of strings", "a JSON string list of programs"
        )
    return sols[0] if sols else ""


FORMAT = register(
    Format(
        name="apps",
        signature=("question", "input_output"),
        description="APPS/TACO format",
        follows="hendrycks/apps eval/testing_util.py; FlagOpen/TACO metrics/testing_util.py",
        convert=convert,
        order=40,
        aliases=("taco",),
        difficulty=lambda row: row.get("difficulty"),
    )
)
