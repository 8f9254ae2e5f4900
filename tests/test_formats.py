"""Dataset files in the competitive-programming formats become `Problem`s (grpo_jax.data).

Literal expected values throughout: each format's detection and field mapping (ids, public / hidden tests,
fn_name, starter code, the exact stdin / expected strings, the ARGS literal), the grade / visible options, one
error per malformed line naming file:line:field, the hostile LiveCodeBench pickle (refused, nothing ran), the
prompt through the chat path and the fenced-block extraction. The fixtures' correct and wrong solutions are
graded by a small in-process reference harness (LiveCodeBench's comparison rules) and, once the sandbox has
the "stdout" and "json_eq" kinds, by the Executor.
"""

from __future__ import annotations

import base64
import contextlib
import copyreg
import gzip
import io
import json
import os
import pickle
import pickletools
import sys
import zlib
from decimal import Decimal, InvalidOperation
from pathlib import Path

import pytest

from grpo_jax import data
from grpo_jax.codegen import datasets
from grpo_jax.data import common
from grpo_jax.data.common import DatasetError
from grpo_jax.data.formats import apps, livecodebench
from grpo_jax.problem import Problem
from grpo_jax.sandbox.types import TestCase as TC

FIX = Path(__file__).resolve().parent / "fixtures" / "formats"
SOLUTIONS = [json.loads(line) for line in (FIX / "solutions.jsonl").read_text().splitlines()]
HOSTILE_MARKER = "/tmp/grpo_jax_formats_fixture_pickle_ran"


def stdio(stdin, expected, source):
    return TC(call="", kind="stdout", stdin=stdin, expected=expected, source=source)


def call(text, expected, source):
    return TC(call=text, kind="json_eq", expected=expected, source=source)


def write_rows(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------------------------
# Detection and field mapping
# ------------------------------------------------------------------------------------------------------------
def test_detects_each_format():
    first = {
        name: json.loads((FIX / name).read_text().splitlines()[0])
        for name in ("apps.jsonl", "taco.jsonl", "codecontests.jsonl", "livecodebench.jsonl", "native.jsonl")
    }
    first["humaneval.jsonl"] = json.loads((FIX / "humaneval.jsonl").read_text())
    first["mbpp.jsonl"] = json.loads((FIX / "mbpp.jsonl").read_text())
    assert {k: data.detect_format(v) for k, v in first.items()} == {
        "apps.jsonl": "apps",
        "taco.jsonl": "apps",
        "codecontests.jsonl": "codecontests",
        "livecodebench.jsonl": "livecodebench",
        "native.jsonl": "native",
        "humaneval.jsonl": "humaneval",
        "mbpp.jsonl": "mbpp",
    }
    assert data.detect_format({"task_id": 1}) is None
    sources = {f: sorted({p.source for p in data.load(FIX / f)}) for f in first}
    assert sources == {
        "apps.jsonl": ["apps"],
        "taco.jsonl": ["taco"],
        "codecontests.jsonl": ["codecontests"],
        "livecodebench.jsonl": ["livecodebench"],
        "native.jsonl": ["native"],
        "humaneval.jsonl": ["humaneval"],
        "mbpp.jsonl": ["mbpp"],
    }
    # named explicitly: the same problems; "taco" is "apps"
    assert data.load(FIX / "taco.jsonl", "taco") == data.load(FIX / "taco.jsonl")
    assert data.load(FIX / "apps.jsonl", "apps") == data.load(FIX / "apps.jsonl")
    with pytest.raises(
        ValueError, match=r"fmt=.leetcode.; valid: humaneval, mbpp, livecodebench, codecontests, codeforces"
    ):
        data.load(FIX / "apps.jsonl", "leetcode")
    # a named format the rows do not have: the first row's missing field
    with pytest.raises(DatasetError, match=r"apps\.jsonl:1: name: missing; valid: a string"):
        data.load(FIX / "apps.jsonl", "codecontests")


def test_apps_fields():
    p1, p2, p3, p4 = data.load(FIX / "apps.jsonl")
    assert [p.task_id for p in (p1, p2, p3, p4)] == ["9001", "9002", "9003", "9004"]
    assert all(p.public_tests == () and not p.graded_public for p in (p1, p2, p3, p4))  # APPS: all hidden
    assert (p1.test_kind, p1.entry_point, p1.starter_code, p1.completion_mode) == ("stdio", "", "", "program")
    assert p1.tests == (
        stdio("3\n1 2 3\n", "6\n", "test 0"),
        stdio("2\n5 6\n", "11\n", "test 1"),
        stdio("3\n1000000000 1000000000 1000000000", "3000000000", "test 2"),  # lists of lines, joined
    )
    assert p1.reference.startswith("n = int(input())") and p1.program_prelude == apps.APPS_PRELUDE
    assert "import numpy" not in apps.APPS_PRELUDE and "from typing import List, Tuple\n" in apps.APPS_PRELUDE
    # call-based: inputs are argument lists; outputs wrapped in a one-element list are unwrapped
    assert (p2.test_kind, p2.entry_point) == ("call", "first_or_default")
    assert p2.starter_code == "def first_or_default(items, default):\n\t"
    assert p2.tests == (
        call("first_or_default(*[[1, 2], None])", 1, "test 0"),
        call("first_or_default(*[[[1, 2], [3]], 0])", [1, 2], "test 1"),
        call("first_or_default(*[[], True])", True, "test 2"),
    )
    assert p3.tests == (
        call("Solution().twoSum(*[[2, 7, 11, 15], 9])", [0, 1], "test 0"),
        call("Solution().twoSum(*[[3, 2, 4], 6])", [1, 2], "test 1"),
    )
    assert (
        p4.tests[2] == stdio("3\n1 1 2\n", "1.333333\n", "test 2") and p4.reference == ""
    )  # "solutions": "[]"
    t0, t1 = data.load(FIX / "taco.jsonl")
    assert (t0.task_id, t0.source, t0.entry_point, t1.task_id, t1.test_kind) == (
        "0",
        "taco",
        "mean",
        "1",
        "stdio",
    )
    assert t0.tests == (call("mean(*[[2, 4]])", 3.0, "test 0"), call("mean(*[[1, 2, 3, 4]])", 2.5, "test 1"))


def test_apps_outputs_and_dict_keys_as_their_testing_util(tmp_path):
    io_ = {
        "fn_name": "f",
        "inputs": [[{"1": "a", "2": "b"}, 2], [{"x": 1}], [1], [2], [3]],
        "outputs": [[{"2": 3}], {"5": 1}, [1, 2], [[1, 2]], []],
    }
    row = {"problem_id": 7, "question": "q", "starter_code": "def f(*a):\n", "input_output": json.dumps(io_)}
    (p,) = data.load(write_rows(tmp_path / "a.jsonl", [row]))
    assert [(t.call, t.expected) for t in p.tests] == [
        (
            "f(*[{1: 'a', 2: 'b'}, 2])",
            {2: 3},
        ),  # "JSON forces dictionaries to have string keys; this undoes this"
        ("f(*[{'x': 1}])", {5: 1}),  # keys that are not integers stay
        ("f(*[1])", [1, 2]),  # not a one-element list: compared as it is
        ("f(*[2])", [1, 2]),  # [[1, 2]]: the wrapped answer
        ("f(*[3])", []),
    ]
    # an empty fn_name is standard input (APPS's own prompt: `not fn_name`)
    row2 = dict(row, input_output=json.dumps({"fn_name": "", "inputs": ["1\n"], "outputs": ["1\n"]}))
    (q,) = data.load(write_rows(tmp_path / "b.jsonl", [row2]))
    assert q.test_kind == "stdio" and q.tests == (stdio("1\n", "1\n", "test 0"),)


def test_codecontests_fields(tmp_path):
    a, b = data.load(FIX / "codecontests.jsonl")
    assert (a.task_id, b.task_id, a.source, a.test_kind, a.starter_code) == (
        "9000_A. Sum",
        "9000_B. Average",
        "codecontests",
        "stdio",
        "",
    )
    assert a.public_tests == (stdio("3\n1 2 3\n", "6\n", "public 0"),)
    # grade_tests="all": public, then private, then generated
    assert a.tests == (
        stdio("3\n1 2 3\n", "6\n", "public 0"),
        stdio("2\n5 6\n", "11\n", "private 0"),
        stdio("3\n1000000000 1000000000 1000000000\n", "3000000000\n", "generated 0"),
    )
    assert a.graded_public and a.hidden_tests == a.tests[1:]
    assert a.reference.startswith("n = int(input())")  # the first PYTHON3 (3) solution, not the C++ one
    assert b.tests[1] == stdio("4\n1 2 3 4\n", "2.500000\n", "private 0")
    # the proto's repeated Test as a list of objects is read the same
    row = json.loads((FIX / "codecontests.jsonl").read_text().splitlines()[0])
    row["private_tests"] = [{"input": "2\n5 6\n", "output": "11\n"}]
    (c,) = data.load(write_rows(tmp_path / "c.jsonl", [row]))
    assert c.tests == a.tests
    # the proto's file I/O: the tests read input.txt / write output.txt in the sandbox's work dir
    row["input_file"], row["output_file"] = "input.txt", "output.txt"
    (d,) = data.load(write_rows(tmp_path / "d.jsonl", [row]))
    assert {(t.input_file, t.output_file) for t in d.tests} == {("input.txt", "output.txt")}
    row["input_file"] = "../etc/passwd"
    with pytest.raises(
        DatasetError, match=r"e\.jsonl:1: input_file: '\.\./etc/passwd' \(.*\); valid: a plain"
    ):
        data.load(write_rows(tmp_path / "e.jsonl", [row]))


def test_livecodebench_fields():
    s, two, avg, fod, s2 = data.load(FIX / "livecodebench.jsonl")
    assert [p.task_id for p in (s, two, avg, fod, s2)] == ["abc900_a", "3999", "3998", "3997", "abc900_b"]
    assert {p.source for p in (s, two)} == {"livecodebench"} and {p.split for p in (s, two)} == {"test"}
    assert s.program_prelude == livecodebench.LCB_PRELUDE and livecodebench.LCB_PRELUDE.endswith(
        "sys.setrecursionlimit(50000)\n"
    )
    assert (s.test_kind, s.entry_point, len(s.public_tests), len(s.hidden_tests)) == ("stdio", "", 1, 2)
    assert s.tests == (  # private as a plain JSON string
        stdio("3\n1 2 3\n", "6\n", "public 0"),
        stdio("2\n5 6\n", "11\n", "private 0"),
        stdio("3\n1000000000 1000000000 1000000000\n", "3000000000\n", "private 1"),
    )
    # functional: metadata.func_name; one JSON argument a line; class Solution from the starter code
    assert (two.test_kind, two.entry_point) == ("call", "twoSum")
    assert two.starter_code.startswith("class Solution:\n    def twoSum(self, nums: List[int]")
    assert two.tests == (  # private as base64 + zlib + pickle of the JSON string
        call("Solution().twoSum(*[[1, 2, 4], 6])", [1, 2], "public 0"),
        call("Solution().twoSum(*[[3, 2, 4], 6])", [1, 2], "private 0"),
        call("Solution().twoSum(*[[2, 7, 11, 15], 9])", [0, 1], "private 1"),
    )
    assert avg.tests == (
        call("Solution().average(*[[2, 4]])", 3.0, "public 0"),
        call("Solution().average(*[[1, 2, 3, 4]])", 2.5, "private 0"),
    )
    assert type(avg.tests[0].expected) is float
    # JSON null / true become Python None / True in the ARGS literal and in the expected data
    assert fod.tests == (
        call("Solution().firstOrDefault(*[[5, 6], None])", 5, "public 0"),
        call("Solution().firstOrDefault(*[[], True])", True, "private 0"),
        call("Solution().firstOrDefault(*[[], None])", None, "private 1"),
    )
    assert s2.hidden_tests[1] == stdio("3\n1 1 2\n", "1.333333\n", "private 1")


def test_native_fields():
    sm, fod, two, mean, avg = data.load(FIX / "native.jsonl")
    assert [p.task_id for p in (sm, fod, two, mean, avg)] == [
        "native/sum",
        "native/first_or_default",
        "native/two_sum",
        "native/mean",
        "native/average",
    ]
    assert (sm.test_kind, sm.source, sm.split, sm.program_prelude, sm.time_limit_s) == (
        "stdio",
        "native",
        "train",
        "",
        None,
    )
    assert sm.reference.startswith("n = int(input())") and sm.description.startswith("Given n integers")
    assert fod.tests == (
        call("first_or_default(*[[1, 2], None])", 1, "public 0"),
        call("first_or_default(*[[[1, 2], [3]], 0])", [1, 2], "private 0"),
        call("first_or_default(*[[], True])", True, "private 1"),
    )
    assert fod.starter_code == "def first_or_default(items, default):\n"
    assert (two.split, two.tests[1]) == (
        "test",
        call("Solution().twoSum(*[[3, 2, 4], 6])", [1, 2], "private 0"),
    )
    assert (mean.time_limit_s, mean.starter_code, mean.tests[1]) == (
        2.0,
        "",
        call("mean(*[[1, 2, 3, 4]])", 2.5, "private 0"),
    )


def test_py_literal():
    value = json.loads('[true, false, null, 1.5, -0.0, "a\'b", {"k": [1e400]}, {"1": -1e400}]')
    text = common.py_literal(value)
    assert text == "[True, False, None, 1.5, -0.0, \"a'b\", {'k': [1e999]}, {'1': -1e999}]"
    assert eval(text) == value  # an expression that evaluates to the data
    assert common.py_literal({1: float("nan")}) == "{1: float('nan')}"


# ------------------------------------------------------------------------------------------------------------
# Grade / visible options and the prompt
# ------------------------------------------------------------------------------------------------------------
def test_grade_tests_visible_tests_max_tests():
    (a,) = [p for p in data.load(FIX / "native.jsonl") if p.task_id == "native/sum"]
    (h,) = [p for p in data.load(FIX / "native.jsonl", grade_tests="private") if p.task_id == "native/sum"]
    assert (len(a.tests), a.graded_public, len(h.tests), h.graded_public) == (3, True, 2, False)
    assert h.tests == a.hidden_tests == h.hidden_tests and h.public_tests == a.public_tests
    assert a.with_grade_tests("private") == h and h.with_grade_tests("all") == a  # the held-out problem
    with pytest.raises(ValueError, match="grade_tests='public'; valid: all, private"):
        a.with_grade_tests("public")
    # visible_tests: none by default (the datasets' statements carry their examples), N, or None = all
    assert a.prompt == a.description.strip() + "\n\n" + common.STDIO_INSTRUCTION + "\n"
    (v,) = [p for p in data.load(FIX / "native.jsonl", visible_tests=1) if p.task_id == "native/sum"]
    assert v.prompt == (
        data.load(FIX / "native.jsonl")[0].description.strip()
        + "\n\nExample:\n\nInput:\n```\n3\n1 2 3\n```\nOutput:\n```\n6\n```\n\n"
        + common.STDIO_INSTRUCTION
        + "\n"
    )
    assert v.tests == a.tests  # what is shown does not change what grades
    (m,) = [p for p in data.load(FIX / "livecodebench.jsonl", max_tests=1) if p.task_id == "3999"]
    assert [t.source for t in m.tests] == ["public 0", "private 0"]
    for bad in ({"grade_tests": "hidden"}, {"visible_tests": -1}, {"max_tests": 0}):
        with pytest.raises(ValueError, match="valid:"):
            data.load(FIX / "native.jsonl", **bad)


def test_prompts_and_instructions():
    by = {p.task_id: p for p in data.load(FIX / "native.jsonl", visible_tests=None)}
    assert by["native/mean"].prompt == (
        "Return the arithmetic mean of the non-empty list `nums` as a float.\n\n"
        "Example:\n\n>>> mean([2, 4])\n3.0\n\n"
        "Write a Python function `mean`. It is called as `mean(...)` with each test's arguments, and its "
        "return value is checked.\n"
    )
    assert by["native/first_or_default"].prompt.endswith(
        "Starter code:\n```python\ndef first_or_default(items, default):\n```\n\n"
        "Complete the function `first_or_default` of the starter code. It is called as "
        "`first_or_default(...)` with each test's arguments, and its return value is checked.\n"
    )
    assert ">>> first_or_default([1, 2], None)\n1" in by["native/first_or_default"].prompt
    assert by["native/two_sum"].prompt.endswith(
        "Complete the method `twoSum` of `class Solution` in the starter code. It is called as "
        "`Solution().twoSum(...)` with each test's arguments, and its return value is checked.\n"
    )
    # an example longer than MAX_EXAMPLE_CHARS is not shown (never cut)
    big = common.build_prompt("S", test_kind="stdio", examples=())
    assert big == "S\n\n" + common.STDIO_INSTRUCTION + "\n"


class _ChatTok:
    """A tokenizer stand-in for the chat path: renders the messages it is given."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return json.dumps(messages)


def test_prompt_goes_through_the_chat_path_and_the_fenced_block_is_the_program():
    from grpo_jax.codegen import pipeline

    p = data.load(FIX / "livecodebench.jsonl")[1]
    fmt = pipeline.PromptFormat(kind="chat", system="sys")
    rendered = json.loads(pipeline.render_prompt(_ChatTok(), p, fmt))
    assert rendered == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": pipeline.PROGRAM_INSTRUCTION.replace("{prompt}", p.prompt)},
    ]
    assert pipeline.render_prompt(_ChatTok(), p) == p.prompt  # plain: the prompt as it is
    reply = "Here it is:\n```python\nclass Solution:\n    pass\n```\nand ```python\nx = 1\n```\n"
    code = pipeline.completion_for(p, reply, fmt)
    assert code == "class Solution:\n    pass\n"  # the first fenced block
    assert p.program_for(code) == livecodebench.LCB_PRELUDE + code
    assert pipeline.extract_code("```py\nprint(1)") == "print(1)"  # an unclosed fence runs to the end
    assert pipeline.extract_code("print(2)\n") == "print(2)\n"  # no fence: the whole reply


# ------------------------------------------------------------------------------------------------------------
# Malformed rows: one error each, naming file:line:field and what is valid
# ------------------------------------------------------------------------------------------------------------
APPS_OK = {
    "problem_id": 1,
    "question": "q",
    "input_output": json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]}),
}
LCB_OK = json.loads((FIX / "livecodebench.jsonl").read_text().splitlines()[0])
NATIVE_OK = json.loads((FIX / "native.jsonl").read_text().splitlines()[1])


def _apps(**io_):
    return dict(APPS_OK, input_output=json.dumps(io_))


def _lcb_pub(tests):
    return dict(LCB_OK, public_test_cases=json.dumps(tests))


MALFORMED = [
    # (rows, the message's start after "PATH:", a part of what is valid)
    ([APPS_OK, "{not json"], "2: line: not JSON (Expecting property name", "one JSON object a line"),
    ([APPS_OK, "[1]"], "2: line: a JSON list", "one JSON object a line"),
    ([dict(APPS_OK, input_output="{")], "1: input_output: not JSON", '"inputs": [...]'),
    ([dict(APPS_OK, input_output="")], "1: input_output: empty (the problem has no tests)", '"fn_name"?'),
    ([_apps(inputs=["1"], outputs=[])], "1: input_output: 1 inputs but 0 outputs", "as many of each"),
    (
        [_apps(inputs=[[1]], outputs=[1], fn_name="a b")],
        "1: input_output.fn_name: 'a b' is not",
        "identifier",
    ),
    (
        [_apps(inputs=[[1], 2], outputs=[1, 2], fn_name="f")],
        "1: input_output.inputs[1]: a JSON int",
        "argument",
    ),
    ([_apps(inputs=[3], outputs=["1"])], "1: input_output.inputs[0]: a JSON int", "a list of lines"),
    ([dict(APPS_OK, question=5)], "1: question: a JSON int", "a string"),
    ([dict(APPS_OK, solutions="[1]")], "1: solutions: not a list of strings", "programs"),
    ([APPS_OK, dict(APPS_OK)], "2: task_id: '1' already at", "unique ids"),
    ([dict(LCB_OK, metadata="{oops")], "1: metadata: not JSON", "func_name"),
    ([dict(LCB_OK, metadata="[]")], "1: metadata: a JSON list", "func_name"),
    (
        [_lcb_pub([{"input": "1", "output": "1", "testtype": "interactive"}])],
        "1: public_test_cases[0].testtype: 'interactive'",
        '"stdin" or "functional"',
    ),
    (
        [_lcb_pub([{"input": 1, "output": "1", "testtype": "stdin"}])],
        "1: public_test_cases[0]: not {input",
        "str",
    ),
    (
        [
            dict(
                _lcb_pub([{"input": "[1]\n{x", "output": "1", "testtype": "functional"}]),
                metadata='{"func_name": "f"}',
            )
        ],
        "1: public_test_cases[0].input: a line is not JSON",
        "one JSON value a line",
    ),
    (
        [dict(LCB_OK, private_test_cases="!!!notbase64")],
        "1: private_test_cases: neither JSON nor base64",
        "zlib",
    ),
    ([dict(LCB_OK, private_test_cases="aGVsbG8=")], "1: private_test_cases: not zlib data", "base64(zlib"),
    ([dict(LCB_OK, private_test_cases="[]")], "1: tests: no hidden tests", "never sees"),
    ([dict(NATIVE_OK, kind="interactive")], "1: kind: 'interactive'", '"stdio" or "call"'),
    ([{k: v for k, v in NATIVE_OK.items() if k != "fn_name"}], "1: fn_name: missing", "identifier"),
    ([NATIVE_OK, {k: v for k, v in NATIVE_OK.items() if k != "tests"}], "2: tests: missing", "a list"),
    ([dict(NATIVE_OK, tests=[{"args": 1, "output": 1}])], "1: tests[0].args: not a list", '"args"'),
    ([dict(NATIVE_OK, time_limit_s=0)], "1: time_limit_s: 0", "seconds > 0"),
    (
        [{"task_id": 1}],
        "1: fields: an unknown schema (fields seen: task_id); neither HumanEval format",
        "fmt= one of humaneval, mbpp, livecodebench",
    ),
]


@pytest.mark.parametrize(
    "rows, message, valid", MALFORMED, ids=[m[1].split(":")[1] + str(i) for i, m in enumerate(MALFORMED)]
)
def test_malformed_row_is_one_error_naming_file_line_field(tmp_path, rows, message, valid):
    path = write_rows(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetError) as e:
        data.load(path)
    text = str(e.value)
    assert text.startswith(f"{path}:{message}"), text
    assert "; valid: " in text and valid in text.split("; valid: ", 1)[1], text
    assert e.value.where == f"{path}:{message.split(':')[0]}" and e.value.field == message.split(": ")[1]
    # collected instead: exactly one error for the bad line, the good rows kept
    errors: list = []
    good = data.load(path, errors=errors) if len(rows) > 1 else None
    if good is not None:
        assert len(errors) == 1 and str(errors[0]) == text and len(good) == len(rows) - 1


def test_line_numbers_count_blank_lines_and_json_lists(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(
        "\n" + json.dumps(APPS_OK) + "\n\n" + json.dumps(dict(APPS_OK, problem_id=2, question=1)) + "\n"
    )
    with pytest.raises(DatasetError, match=r"a\.jsonl:4: question: a JSON int; valid: a string"):
        data.load(path)
    # a .json list (gzipped too): items are numbered
    lst = tmp_path / "a.json.gz"
    with gzip.open(lst, "wt") as f:
        json.dump([APPS_OK, dict(APPS_OK, problem_id=2, question=1)], f)
    with pytest.raises(DatasetError, match=r"a\.json\.gz:item 2: question: a JSON int"):
        data.load(lst)
    with gzip.open(lst, "wt") as f:
        json.dump([APPS_OK, dict(APPS_OK, problem_id=2)], f)
    assert [p.task_id for p in data.load(lst)] == ["1", "2"]
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no problems"):
        data.load(empty)


# ------------------------------------------------------------------------------------------------------------
# Untrusted pickles
# ------------------------------------------------------------------------------------------------------------
class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _globals_named(data: bytes) -> list[str]:
    """The GLOBAL / STACK_GLOBAL references of a pickle, read without loading it."""
    out, strings = [], []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            out.append(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            out.append(".".join(strings[-2:]))
        elif isinstance(arg, str):
            strings.append(arg)
    return out


def test_hostile_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    payload = pickle.dumps(_RunsCode(marker))
    assert _globals_named(payload) == ["posix.system"]  # plain pickle.loads would call os.system
    row = dict(LCB_OK, private_test_cases=base64.b64encode(zlib.compress(payload)).decode())
    path = write_rows(tmp_path / "h.jsonl", [row])
    with pytest.raises(
        DatasetError, match=r"h\.jsonl:1: private_test_cases: refused pickle: refused global posix"
    ):
        data.load(path)
    assert not marker.exists()
    # the stored fixture line does the same
    if os.path.exists(HOSTILE_MARKER):
        os.unlink(HOSTILE_MARKER)
    stored = json.loads((FIX / "livecodebench_hostile.jsonl").read_text())["private_test_cases"]
    assert _globals_named(zlib.decompress(base64.b64decode(stored))) == ["posix.system"]
    with pytest.raises(DatasetError, match="refused global posix.system"):
        data.load(FIX / "livecodebench_hostile.jsonl")
    assert not os.path.exists(HOSTILE_MARKER)
    for proto in (0, 2):  # GLOBAL / INST / REDUCE in the old protocols too
        with pytest.raises(pickle.UnpicklingError, match="refused global"):
            livecodebench.restricted_loads(pickle.dumps(_RunsCode(marker), protocol=proto))
    copyreg.add_extension("posix", "system", 240)  # the extension registry (EXT1) names it by a code
    try:
        payload = pickle.dumps(_RunsCode(marker), protocol=2)
    finally:
        copyreg.remove_extension("posix", "system", 240)
    assert "EXT1" in [op.name for op, _, _ in pickletools.genops(payload)]
    copyreg.add_extension("posix", "system", 240)
    try:
        with pytest.raises(pickle.UnpicklingError, match="refused global posix.system"):
            livecodebench.restricted_loads(payload)
    finally:
        copyreg.remove_extension("posix", "system", 240)
    assert not marker.exists()


def test_restricted_unpickler_takes_a_plain_str_only():
    text = json.dumps([{"input": "1", "output": "1", "testtype": "stdin"}])
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        assert livecodebench.restricted_loads(pickle.dumps(text, protocol=proto)) == text
    for other in ([text], {"a": 1}, b"x", 3):
        with pytest.raises(pickle.UnpicklingError, match="not a str"):
            livecodebench.restricted_loads(pickle.dumps(other))
    with pytest.raises(pickle.UnpicklingError, match="truncated"):
        livecodebench.restricted_loads(pickle.dumps(text)[:-3])
    with pytest.raises(pickle.UnpicklingError, match="malformed pickle"):
        livecodebench.restricted_loads(b"Ixyz\n.")
    assert livecodebench.decode_lcb_private(text) == json.loads(text)  # plain JSON first, as LCB does
    packed = base64.b64encode(zlib.compress(pickle.dumps([text]))).decode()
    with pytest.raises(ValueError, match="refused pickle: the pickle holds a list, not a str"):
        livecodebench.decode_lcb_private(packed)


def test_inflation_is_capped(monkeypatch):
    text = json.dumps([{"input": "x" * 5000, "output": "1", "testtype": "stdin"}])
    packed = base64.b64encode(zlib.compress(pickle.dumps(text))).decode()
    assert livecodebench.decode_lcb_private(packed)[0]["output"] == "1"
    monkeypatch.setattr(livecodebench, "MAX_DECODED_BYTES", 1000)
    with pytest.raises(ValueError, match="inflates to more than 1000 bytes"):
        livecodebench.decode_lcb_private(packed)


# ------------------------------------------------------------------------------------------------------------
# Large inputs (made here, not stored)
# ------------------------------------------------------------------------------------------------------------
def test_large_inputs(tmp_path):
    n = 200_000
    nums = " ".join(str(i % 1000) for i in range(n))
    stdin, out = f"{n}\n{nums}\n", f"{sum(i % 1000 for i in range(n))}\n"
    cc = json.loads((FIX / "codecontests.jsonl").read_text().splitlines()[0])
    cc["generated_tests"] = {"input": [stdin], "output": [out]}
    lcb = dict(LCB_OK, private_test_cases=base64.b64encode(zlib.compress(pickle.dumps(json.dumps(
        [{"input": stdin, "output": out, "testtype": "stdin"}])))).decode())  # fmt: skip
    native = dict(NATIVE_OK, tests=[{"args": [list(range(n)), 0], "output": 0}])
    (c,) = data.load(write_rows(tmp_path / "c.jsonl", [cc]))
    (q,) = data.load(write_rows(tmp_path / "l.jsonl", [lcb]))
    (m,) = data.load(write_rows(tmp_path / "n.jsonl", [native]))
    assert c.tests[-1] == stdio(stdin, out, "generated 0") and len(stdin) > 700_000
    assert q.hidden_tests == (stdio(stdin, out, "private 0"),)
    assert m.tests[-1].call == "first_or_default(*[[" + ", ".join(map(str, range(n))) + "], 0])"
    assert _run_tests(m, "def first_or_default(items, default):\n    return items[0]\n") == [True, True]
    (sum_ok,) = [s["correct"] for s in SOLUTIONS if s["task_id"] == "9000_A. Sum"]
    assert _run_tests(c, sum_ok) == [True] * 3


# ------------------------------------------------------------------------------------------------------------
# The fixtures' solutions: a reference harness here, the sandbox when it has the kinds
# ------------------------------------------------------------------------------------------------------------
def _lines_equal(got: str, want: str) -> bool:
    """LiveCodeBench grade_stdio: stripped lines equal, else every line's tokens equal as Decimals."""
    a = [x.strip() for x in got.strip().split("\n")]
    b = [x.strip() for x in want.strip().split("\n")]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        try:
            if [Decimal(t) for t in x.split()] != [Decimal(t) for t in y.split()]:
                return False
        except InvalidOperation:
            return False
    return True


def _listify(v):
    if isinstance(v, (list, tuple)):
        return [_listify(x) for x in v]
    return v


def _run_tests(p: Problem, completion: str) -> list[bool]:
    """Each test of `p` on `completion`, in this process (the fixtures' programs are ours)."""
    program = p.program_for(completion)
    limit = sys.getrecursionlimit()
    results = []
    try:
        for t in p.tests:
            g = {"__name__": "__main__"}
            out = io.StringIO()
            try:
                old_stdin = sys.stdin
                sys.stdin = io.StringIO(t.stdin or "")
                with contextlib.redirect_stdout(out):
                    exec(compile(program, "solution.py", "exec", dont_inherit=True), g)
                    got = eval(t.call, g) if t.kind == "json_eq" else None
            except Exception:
                results.append(False)
                continue
            finally:
                sys.stdin = old_stdin
            if t.kind == "stdout":
                results.append(_lines_equal(out.getvalue(), t.expected))
            else:
                want = t.expected
                same = got is want if want is None or type(want) is bool else type(got) is not bool
                results.append(same and _listify(got) == want)
    finally:
        sys.setrecursionlimit(limit)
    return results


def _fixture_problems() -> dict[tuple[str, str], Problem]:
    out = {}
    for f in sorted({s["file"] for s in SOLUTIONS}):
        for p in data.load(FIX / f):
            out[(f, p.task_id)] = p
    return out


def test_fixture_solutions_in_a_reference_harness():
    probs = _fixture_problems()
    checked = 0
    for s in SOLUTIONS:
        p = probs[(s["file"], s["task_id"])]
        if p.test_kind == "assert":
            continue  # HumanEval / MBPP: graded by the sandbox below
        good, bad = _run_tests(p, s["correct"]), _run_tests(p, s["wrong"])
        assert all(good), (s["task_id"], good)
        assert not all(bad), (s["task_id"], bad)
        n_pub = len(p.public_tests)
        if s["wrong_passes_public"]:
            assert all(bad[:n_pub]) and not all(bad[n_pub:]), (s["task_id"], bad)
        checked += 1
    assert checked == 18


def _sandbox_has_kinds() -> bool:
    from grpo_jax.sandbox import types

    return {"stdout", "json_eq"} <= set(getattr(types, "KINDS", ()))


def test_fixture_solutions_in_the_sandbox():
    """The fixtures' correct programs pass and the wrong ones fail, graded by the Executor. HumanEval / MBPP
    always; the stdin/stdout and call-based problems once the sandbox has the "stdout" and "json_eq" kinds."""
    import mainjob

    from grpo_jax.codegen.jobs import jobs_for

    probs = _fixture_problems()
    full = _sandbox_has_kinds()
    chosen = [s for s in SOLUTIONS if full or probs[(s["file"], s["task_id"])].test_kind == "assert"]
    problems = [probs[(s["file"], s["task_id"])] for s in chosen for _ in (0, 1)]
    completions = [c for s in chosen for c in (s["correct"], s["wrong"])]
    with mainjob.executor() as ex:
        verdicts = ex.run(jobs_for(problems, completions))
    for i, s in enumerate(chosen):
        good, bad = verdicts[2 * i], verdicts[2 * i + 1]
        assert good.passed, (s["task_id"], good)
        assert not bad.passed, (s["task_id"], bad)
        n_pub = len(problems[2 * i].public_tests)
        if s["wrong_passes_public"]:
            assert all(t.passed for t in bad.tests[:n_pub]), (s["task_id"], bad)
    assert len(chosen) == (20 if full else 2)


def test_humaneval_and_mbpp_rows_through_their_converters():
    row = json.loads((FIX / "humaneval.jsonl").read_text())
    assert data.load(FIX / "humaneval.jsonl") == [datasets.humaneval_problem(row)]
    (m,) = data.load(FIX / "mbpp.jsonl")
    assert (m.task_id, m.source, m.completion_mode, m.test_kind, m.program_prelude) == (
        "Mbpp/9001",
        "mbpp",
        "program",
        "assert",
        "",
    )
