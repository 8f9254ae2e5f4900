"""KodCode-style pytest test code -> parent-graded TestCases + a child check, graded by the real sandbox."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.pytest_tests import case_test_name, split_pytest
from grpo_jax.sandbox.types import Job, Limits, Status

LIM = Limits(wall_s=4.0, cpu_s=4)
P, WA, RE = Status.PASSED, Status.WRONG_ANSWER, Status.RUNTIME_ERROR


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=LIM) as e:
        yield e


def run(ex, split, programs):
    jobs = [
        Job(program=p, tests=split.tests, child_check=split.child_check, setup_code=split.setup_code)
        for p in programs
    ]
    return ex.run(jobs)


# ------------------------------------------------------------------------------------------------------------
# A KodCode-style file: parent-graded asserts, parametrize, pytest.raises, a loop, approx on a list
# ------------------------------------------------------------------------------------------------------------
KOD = '''
from solution import two_sum, add as plus
import pytest
import math


def test_basic():
    """Two asserts: two parent-graded tests that share the test's name."""
    assert two_sum([2, 7, 11, 15], 9) == [0, 1]
    assert two_sum([3, 3], 6) == [0, 1]


@pytest.mark.parametrize("a,b,expected", [(1, 2, 3), (0, 0, 0), pytest.param(-1, 1, 0, id="neg")])
def test_add(a, b, expected):
    assert plus(a, b) == expected


def test_add_pi():
    assert plus(math.pi, 0) == math.pi


def test_raises():
    with pytest.raises(ValueError, match="empty") as excinfo:
        two_sum([], 1)
    assert isinstance(excinfo.value, ValueError) and excinfo.type is ValueError


def test_loop():
    for n in range(2, 6):
        assert two_sum(list(range(n)), 2 * n - 3) == [n - 2, n - 1]


def test_approx_list():
    assert [plus(0.1, 0.2), plus(1, 1)] == pytest.approx([0.3, 2.0])


if __name__ == "__main__":
    pytest.main([__file__])
'''

TWO_SUM = """
def two_sum(nums, target):
    if not nums:
        raise ValueError("empty input")
    seen = {}
    for i, x in enumerate(nums):
        if target - x in seen:
            return [seen[target - x], i]
        seen[x] = i
    return []
"""
RIGHT = TWO_SUM + "\ndef add(a, b):\n    return a + b\n"


def test_split_kodcode_file():
    s = split_pytest(KOD)
    assert s.names == (
        "test_basic",
        "test_add[1-2-3]",
        "test_add[0-0-0]",
        "test_add[neg]",
        "test_add_pi",
        "test_raises",
        "test_loop",
        "test_approx_list",
    )
    # parent side: 2 asserts of test_basic + 3 parameter sets + test_add_pi; the alias is the program's name
    assert [t.call for t in s.tests] == [
        "two_sum([2, 7, 11, 15], 9)",
        "two_sum([3, 3], 6)",
        "add(1, 2)",
        "add(0, 0)",
        "add(-1, 1)",
        "add(math.pi, 0)",
    ]
    assert [t.expected for t in s.tests[:5]] == [[0, 1], [0, 1], 3, 0, 0]
    assert s.tests[5].expected_expr == "math.pi" and "import math" in s.tests[5].prelude
    assert [case_test_name(t.source) for t in s.tests] == [
        "test_basic",
        "test_basic",
        "test_add[1-2-3]",
        "test_add[0-0-0]",
        "test_add[neg]",
        "test_add_pi",
    ]
    assert s.tests[2].source == "test_add[1-2-3]: assert plus(1, 2) == 3"
    assert s.setup_code == "import math\n"  # the call add(math.pi, 0) runs in the program's namespace
    # child side: only the three tests that are not plain asserts, and never the module's main guard
    assert s.child_check is not None
    module = s.child_check.split("# ---- the test module ----")[1]
    assert "def test_raises" in module and "def test_loop" in module and "def test_approx_list" in module
    assert "def test_basic" not in module and "def test_add(" not in module and "pytest.main" not in module
    assert "('test_raises', ('test_raises',), (), 'fn')" in s.child_check


def test_kodcode_file_graded(ex):
    s = split_pytest(KOD)
    programs = [
        RIGHT,
        RIGHT.replace("return [seen[target - x], i]", "return [i, seen[target - x]]"),  # wrong order
        RIGHT.replace('raise ValueError("empty input")', "return []"),  # does not raise
        RIGHT.replace('raise ValueError("empty input")', 'raise KeyError("empty input")'),  # wrong type
        RIGHT.replace('raise ValueError("empty input")', 'raise ValueError("no input")'),  # match= fails
        TWO_SUM + "\ndef add(a, b):\n    return a - b\n",
    ]
    v = run(ex, s, programs)
    assert v[0].passed and v[0].child_check_passed is True
    assert [t.status for t in v[0].tests] == [P] * 6
    assert [t.status for t in v[1].tests] == [WA, WA, P, P, P, P] and v[1].child_check_passed is False
    assert "test_loop" in v[1].detail and "test_raises" not in v[1].detail
    for w in v[2:5]:  # pytest.raises: not raised / another type / message not matching -> the check fails
        assert [t.status for t in w.tests] == [P] * 6
        assert w.child_check_passed is False and "test_raises" in w.detail and not w.passed
    assert "DID NOT RAISE" in v[2].detail
    # a - b: add(1, 2) and add(-1, 1) fail, add(0, 0) and add(pi, 0) pass; approx on the list fails
    assert [t.status for t in v[5].tests] == [P, P, WA, P, WA, P]
    assert v[5].child_check_passed is False and "test_approx_list" in v[5].detail


def test_hostile_results_never_pass(ex):
    """The parent compares plain data: an object whose __eq__ says True (or a list subclass that does) fails a
    parent-graded assert; in the checker it is a reference that equals only itself."""
    s = split_pytest(KOD)
    liar = "class Liar:\n    def __eq__(self, o):\n        return True\n"
    liar += "    def __ne__(self, o):\n        return False\n"
    lying_list = "class Liar(list):\n    def __eq__(self, o):\n        return True\n"
    body = (
        "def two_sum(nums, target):\n    if not nums:\n        raise ValueError('empty')\n    return Liar()\n"
    )
    add = "\ndef add(a, b):\n    return a + b\n"
    programs = [liar + body, lying_list + body]
    v = run(ex, s, [p + add for p in programs])
    for w in v:
        assert not w.passed and w.child_check_passed is False
        assert [t.passed for t in w.tests] == [False, False, True, True, True, True]
    assert [t.status for t in v[1].tests[:2]] == [WA, WA]  # reduced to its plain data: []


# ------------------------------------------------------------------------------------------------------------
# Styles of import; builtins a program defines do not reach the test
# ------------------------------------------------------------------------------------------------------------
MODULE_STYLE = """
import solution
import pytest


def test_mod():
    assert solution.add(2, 3) == 5


def test_mod_child():
    total = 0
    for i in range(3):
        total += solution.add(i, i)
    assert total == 6


def test_raises_call_form():
    info = pytest.raises(ZeroDivisionError, solution.div, 1, 0)
    assert info.type is ZeroDivisionError
"""

STAR_STYLE = """
from solution import *


def test_star():
    assert make_pairs(1) == [(0, 1)]


def test_pairs_child():
    pairs = make_pairs(3)
    assert len(pairs) == 3
    assert sorted(pairs) == [(0, 1), (1, 2), (2, 3)]
"""


def test_import_styles(ex):
    m = split_pytest(MODULE_STYLE)
    assert [t.call for t in m.tests] == ["add(2, 3)"] and m.names == (
        "test_mod",
        "test_mod_child",
        "test_raises_call_form",
    )
    right = "def add(a, b):\n    return a + b\ndef div(a, b):\n    return a / b\n"
    safe_div = "def add(a, b):\n    return a + b\ndef div(a, b):\n    return a / b if b else 0\n"
    s = split_pytest(STAR_STYLE, own_names={"make_pairs"})
    assert [t.call for t in s.tests] == ["make_pairs(1)"]
    pairs = "def make_pairs(n):\n    return [(i, i + 1) for i in range(n)]\n"
    # a program that defines len / sorted to answer what the test wants, and makes no pairs
    hostile = (
        "def make_pairs(n):\n    return [(0, 1)] if n == 1 else []\n"
        "def len(x):\n    return 3\n"
        "def sorted(x):\n    return [(0, 1), (1, 2), (2, 3)]\n"
    )
    v = ex.run(
        [
            Job(program=right, tests=m.tests, child_check=m.child_check),
            Job(program=safe_div, tests=m.tests, child_check=m.child_check),
            Job(program=pairs, tests=s.tests, child_check=s.child_check),
            Job(program=hostile, tests=s.tests, child_check=s.child_check),
        ]
    )
    assert v[0].passed and v[0].child_check_passed
    assert not v[1].passed and "test_raises_call_form" in v[1].detail
    assert v[2].passed and v[2].child_check_passed
    assert v[3].tests[0].passed and v[3].child_check_passed is False and "test_pairs_child" in v[3].detail


# ------------------------------------------------------------------------------------------------------------
# Exceptions of the program, exits, classes, unittest, fixtures, dynamic parameters
# ------------------------------------------------------------------------------------------------------------
EXC = """
import pytest
from solution import parse_age, InvalidAge


def test_own_exception():
    with pytest.raises(InvalidAge, match="negative"):
        parse_age("-3")


def test_any_exception():
    with pytest.raises(Exception):
        parse_age("x")


def test_ok():
    assert parse_age("42") == 42
"""

AGE = """
class InvalidAge(Exception):
    pass

def parse_age(s):
    n = int(s)
    if n < 0:
        raise InvalidAge("negative age")
    return n
"""


def test_program_exceptions_and_exits(ex):
    s = split_pytest(EXC)
    assert [t.call for t in s.tests] == ["parse_age('42')"]
    programs = [
        AGE,
        AGE.replace('raise InvalidAge("negative age")', 'raise ValueError("negative age")'),
        # SystemExit is no Exception (pytest.raises(Exception) does not catch it); a dead process is no raise
        AGE.replace(
            "    n = int(s)\n", "    import sys\n    if s == 'x':\n        sys.exit(1)\n    n = int(s)\n"
        ),
        AGE.replace(
            "    n = int(s)\n", "    import os\n    if s == 'x':\n        os._exit(0)\n    n = int(s)\n"
        ),
    ]
    v = run(ex, s, programs)
    assert v[0].passed and v[0].child_check_passed
    assert v[1].tests[0].passed and v[1].child_check_passed is False and "test_own_exception" in v[1].detail
    for w in v[2:]:
        assert not w.passed and w.child_check_passed is False and "test_any_exception" in w.detail, w


CLASSES = """
import unittest
import pytest
from solution import Solution, square


class TestSolution:
    def test_two_sum(self):
        assert Solution().twoSum([2, 7], 9) == [0, 1]

    @pytest.mark.parametrize("n", [1, 2])
    def test_square(self, n):
        assert square(n) == n * n


class TestWithSetup:
    def setup_method(self, method):
        self.base = 3

    def test_square(self):
        assert square(self.base) == 9


class TestHelper:
    def __init__(self):  # pytest does not collect a class with __init__
        pass

    def test_never(self):
        assert False


class TestUnit(unittest.TestCase):
    def setUp(self):
        self.n = 4

    def test_eq(self):
        self.assertEqual(square(self.n), 16)

    def test_raise(self):
        with self.assertRaises(ValueError):
            square(-1)
"""

SQUARE = """
class Solution:
    def twoSum(self, nums, target):
        return [0, 1] if nums[0] + nums[1] == target else []

def square(n):
    if n < 0:
        raise ValueError("negative")
    return n * n
"""


def test_classes_and_unittest(ex):
    s = split_pytest(CLASSES)
    assert s.names == (
        "TestSolution::test_two_sum",
        "TestSolution::test_square[1]",
        "TestSolution::test_square[2]",
        "TestWithSetup::test_square",
        "TestUnit::test_eq",
        "TestUnit::test_raise",
    )
    # Solution().twoSum(..) is one call of the program's own class; n * n is left to the oracle
    assert [t.call for t in s.tests] == ["Solution().twoSum([2, 7], 9)", "square(1)", "square(2)"]
    assert s.tests[1].expected_expr == "1 * 1"
    v = run(
        ex,
        s,
        [SQUARE, SQUARE.replace("return n * n", "return n * 2"), SQUARE.replace("[0, 1] if", "[1, 0] if")],
    )
    assert v[0].passed and v[0].child_check_passed
    assert [t.status for t in v[1].tests] == [P, WA, P] and v[1].child_check_passed is False
    assert "TestWithSetup::test_square" in v[1].detail and "TestUnit::test_eq" in v[1].detail
    assert [t.status for t in v[2].tests] == [WA, P, P] and v[2].child_check_passed


FIXTURES = """
import pytest
from solution import count_lines, total


def next(*args):  # a helper of the test module: the runner's own `next` is not this one
    raise RuntimeError("the test module's helper")


@pytest.fixture
def numbers():
    data = [1, 2, 3]
    yield data
    data.clear()


@pytest.fixture(scope="module")
def offset():
    return 10


def test_fixture(numbers, offset):
    assert total(numbers) + offset == 16


def test_tmp_path(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("a\\nb\\nc\\n")
    assert count_lines(str(f)) == 3
    assert count_lines(f) == 3


@pytest.mark.parametrize("n", range(3))
def test_dynamic(n):
    assert total([n]) == n


@pytest.mark.skip(reason="not graded")
def test_skipped():
    assert False


@pytest.mark.xfail
def test_xfail():
    assert False


@pytest.mark.parametrize("x,y", [(1, 1), pytest.param(2, 3, marks=pytest.mark.skip)])
def test_param_marks(x, y):
    assert total([x]) == y


@pytest.mark.parametrize("x", [0, 1])
@pytest.mark.parametrize("y", [2, 3])
def test_stacked(x, y):
    assert total([x, y]) == x + y


def test_helper_approx():
    assert total([0.1, 0.2]) == pytest.approx(0.3)
    assert total([1.0, 2.0]) == pytest.approx(3.0001, abs=1e-3)
"""

LINES = """
def count_lines(path):
    with open(path) as f:
        return len(f.read().splitlines())

def total(xs):
    return sum(xs)
"""


def test_fixtures_dynamic_parameters_and_marks(ex):
    s = split_pytest(FIXTURES)
    assert s.names == (
        "test_fixture",
        "test_tmp_path",
        "test_dynamic",
        "test_param_marks[1-1]",
        "test_stacked[2-0]",
        "test_stacked[2-1]",
        "test_stacked[3-0]",
        "test_stacked[3-1]",
        "test_helper_approx",
    )
    assert [case_test_name(t.source) for t in s.tests] == [
        "test_param_marks[1-1]",
        "test_stacked[2-0]",
        "test_stacked[2-1]",
        "test_stacked[3-0]",
        "test_stacked[3-1]",
        "test_helper_approx",
        "test_helper_approx",
    ]
    assert [t.call for t in s.tests[1:5]] == [
        "total([0, 2])",
        "total([1, 2])",
        "total([0, 3])",
        "total([1, 3])",
    ]
    assert [(t.kind, t.expected) for t in s.tests[5:]] == [
        ("isclose", (0.3, 1e-06, 1e-12)),
        ("isclose", (3.0001, 0.0, 0.001)),  # only abs= given: no relative tolerance (pytest)
    ]
    v = run(
        ex,
        s,
        [
            LINES,
            LINES.replace("return sum(xs)", "return sum(xs) + (1 if len(xs) == 1 and xs[0] == 2 else 0)"),
            LINES.replace("return len(f.read().splitlines())", "return 3 if isinstance(path, str) else 0"),
            LINES.replace("return sum(xs)", "return sum(xs) + 1e-3"),
        ],
    )
    assert v[0].passed and v[0].child_check_passed
    assert v[1].child_check_passed is False and "test_dynamic" in v[1].detail  # n == 2 fails
    assert "test_fixture" not in v[1].detail
    assert v[2].child_check_passed  # tmp_path reaches the program as a str: a path object never crosses
    assert [t.status for t in v[3].tests] == [WA, WA, WA, WA, WA, WA, P]  # 3.001 is within abs=1e-3


def test_names_match_pytest(tmp_path):
    """split_pytest names tests as pytest itself collects them (stacked parametrize, ids=, duplicates)."""
    code = (
        FIXTURES
        + CLASSES.split("from solution import Solution, square")[1]
        + """
@pytest.mark.parametrize("s", ["a b", "x\\ny", "", b"\\xff", None, 2.5, True, [1], "é"])
def test_ids(s):
    assert total([1]) == 1


@pytest.mark.parametrize("a", [1, 1, 2], ids=["one", None, "two"])
def test_dupes(a):
    assert total([a]) == a


@pytest.mark.parametrize("a", [(1, 2), (1, 2)])
def test_dupes2(a):
    assert total(a) == 3
"""
    )
    (tmp_path / "solution.py").write_text("class Solution:\n    pass\ndef square(n):\n    return n\n" + LINES)
    (tmp_path / "test_kod.py").write_text("import unittest\n" + code)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "test_kod.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    collected = [
        line.split("::", 1)[1] for line in out.stdout.splitlines() if line.startswith("test_kod.py::")
    ]
    assert collected, out.stdout + out.stderr
    mine = split_pytest("import unittest\n" + code).names
    # pytest lists skipped / xfail tests too (split_pytest drops them) and expands range(3) at collection
    # (split_pytest: one child-side test, expanded at run time)
    dropped = {"test_skipped", "test_xfail", "test_param_marks[2-3]"}
    expected = [n for n in collected if n not in dropped and not n.startswith("test_dynamic[")]
    assert [n for n in collected if n.startswith("test_dynamic[")] == [f"test_dynamic[{i}]" for i in range(3)]
    assert list(mine) == expected[:2] + ["test_dynamic"] + expected[2:]


# ------------------------------------------------------------------------------------------------------------
# What is refused (the loader reports / skips the row)
# ------------------------------------------------------------------------------------------------------------
REFUSED = [
    (
        "def test_out(capsys):\n    f()\n    assert capsys.readouterr().out == 'x'\n",
        "test_out: fixture `capsys`",
    ),
    ("def test_mp(monkeypatch):\n    monkeypatch.setattr('a.b', 1)\n", "fixture `monkeypatch`"),
    ("def test_x(data):\n    assert f(data) == 1\n", "fixture `data` is not supported (it is not defined"),
    (
        "def test_w():\n    with pytest.warns(UserWarning):\n        f()\n",
        "test_w: `pytest.warns` is not supported",
    ),
    (
        "@pytest.mark.parametrize('x', [1], indirect=True)\ndef test_i(x):\n    assert f(x)\n",
        "test_i: indirect parametrize",
    ),
    (
        "@pytest.fixture(params=[1, 2])\ndef p(request):\n    return 1\n\ndef test_p(p):\n    pass\n",
        "params=",
    ),
    (
        "from unittest import mock\n@mock.patch('os.getcwd')\ndef test_d(m):\n    pass\n",
        "decorator @mock.patch",
    ),
    ("async def test_a():\n    assert f()\n", "test_a: async"),
    ("def helper():\n    return 1\n", "no test"),
    ("def test_(:\n", "does not parse"),
    # objects of the program stay in its process: an instance's methods, in-place changes, functions passed
    (
        "def test_stack():\n    s = Stack()\n    s.push(1)\n    assert s.pop() == 1\n",
        "test_stack: uses `s.push`",
    ),
    (
        "def test_inplace():\n    a = [3, 1]\n    f(a)\n    assert a == [1, 3]\n",
        "then reads `a`: an in-place change",
    ),
    (
        "def test_fn():\n    out = f(lambda x: x, [1])\n    assert out == [1]\n",
        "passes a function to the program",
    ),
    (
        "def test_key():\n    out = f([1], key=len)\n    assert out == [1]\n",
        "passes a function to the program",
    ),
]


@pytest.mark.parametrize("body,message", REFUSED)
def test_refusals(body, message):
    with pytest.raises(ValueError, match=None) as info:
        split_pytest("import pytest\nfrom solution import f, Stack\n\n" + body)
    assert message in str(info.value), str(info.value)


def test_not_refused():
    """Shapes close to the refused ones that do work across processes."""
    code = """
import pytest
from solution import f, Stack


def test_immutable_arg():
    s = "abc"
    f(s)
    assert f(s) == 3


def test_raises_bare_call():
    a = [1]
    with pytest.raises(ValueError):
        f(a)
    assert a == [1]


def test_lambda_in_parent_call():
    assert f(lambda x: x, [1]) == [1]


def test_fresh_instance():
    assert Stack(3).size() == 3
"""
    s = split_pytest(code)
    assert [t.call for t in s.tests] == ["f(lambda x: x, [1])", "Stack(3).size()"]
    assert len(s.names) == 4
