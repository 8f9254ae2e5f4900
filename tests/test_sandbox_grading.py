"""Parent-side grading without processes: assert splitting, tagged values, strict comparison, caps."""

from __future__ import annotations

import json

import pytest

from grpo_jax.sandbox import grading
from grpo_jax.sandbox.types import Status
from grpo_jax.sandbox.types import TestCase as TC


def test_split_assert():
    tc = grading.split_assert("assert add(1, 2) == 3")
    assert tc == TC("add(1, 2)", 3, "assert add(1, 2) == 3")
    tc = grading.split_assert("assert (1, [2]) == f(x)")
    assert tc.call == "f(x)" and tc.expected == (1, [2])
    assert grading.split_assert("assert f(1) == g(2)") is None  # no literal side
    assert grading.split_assert("assert math.isclose(f(1), 2.0)") is None
    assert grading.split_assert("assert f(1) != 2") is None
    assert grading.split_assert("x = 1") is None
    assert grading.split_assert("assert f(1) == set([1])") is None


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -5,
        1 << 80,
        1.5,
        float("inf"),
        "s\udcff",
        [1, (2, 3)],
        {"a": [1]},
        {1, 2},
        frozenset({3}),
        b"\x00\xff",
        1 + 2j,
        {(1, 2): {True: None}},
    ],
)
def test_tag_roundtrip(value):
    got = grading.untag(json.loads(json.dumps(grading.tag(value))))
    assert grading.strict_equal(got, value)


def test_strict_equal():
    se = grading.strict_equal
    assert not se(True, 1) and not se(1, True) and not se(0, False)
    assert not se((1, 2), [1, 2]) and not se([1], (1,))
    assert se(3, 3.0) and se(3.0, 3)  # numeric widening (not bool)
    assert not se(True, 1.0)
    assert not se({1: "a"}, {True: "a"})
    assert not se({1}, {True})
    assert se(0.30000000000000004, 0.3, 1e-9) and not se(0.30000000000000004, 0.3)
    assert not se(float("nan"), float("nan"))
    assert se({"a": [1, (2,)]}, {"a": [1, (2,)]})


def test_untag_rejects_garbage():
    for bad in [{"x": 1}, {"i": 1.5}, {"l": 5}, [1], {"i": 1, "f": "2"}, {"d": [[{"l": []}, 1]]}]:
        with pytest.raises(grading.BadResult):
            grading.untag(bad)
    deep = None
    for _ in range(500):
        deep = {"l": [deep]}
    with pytest.raises(grading.BadResult):
        grading.untag(deep)


def test_grade_records_caps_and_precedence():
    tests = (TC("f(1)", 2), TC("f(2)", 3))
    rec = lambda *rs: "".join(json.dumps(r) + "\n" for r in rs).encode()
    ok = rec(
        {"k": "start"}, {"k": "t", "i": 0, "v": {"i": 2}}, {"k": "t", "i": 1, "v": {"i": 3}}, {"k": "done"}
    )
    v = grading.grade(tests, False, {"secs": 0.1}, ok, b"", 1 << 20)
    assert v.passed and v.status is Status.PASSED
    # a duplicate (forged) record fails that test
    dup = ok + rec({"k": "t", "i": 0, "v": {"i": 2}})
    assert not grading.grade(tests, False, {}, dup, b"", 1 << 20).passed
    # missing records after a clean start: runtime error (the process ended early)
    v = grading.grade(tests, False, {}, rec({"k": "start"}, {"k": "t", "i": 0, "v": {"i": 2}}), b"", 1 << 20)
    assert v.status is Status.RUNTIME_ERROR
    # timeout beats everything but syntax/infra; the remaining tests are TIMEOUT
    v = grading.grade(
        tests,
        False,
        {"timed_out": True},
        rec({"k": "start"}, {"k": "t", "i": 0, "v": {"i": 2}}),
        b"",
        1 << 20,
    )
    assert v.status is Status.TIMEOUT and [t.status for t in v.tests] == [Status.PASSED, Status.TIMEOUT]
    # output limit, infra error
    assert grading.grade(tests, False, {"output_limit": True}, ok, b"", 1 << 20).status is Status.OUTPUT_LIMIT
    assert grading.grade(tests, False, {"infra": "x"}, ok, b"", 1 << 20).status is Status.INFRA_ERROR
    # garbage bytes: never crash, never pass
    v = grading.grade(tests, False, {}, b"\xff\x00{{{\n[[[[" * 1000, b"\x1b[2J", 1 << 20)
    assert not v.passed
    # oversize result is truncated and not passed
    v = grading.grade(tests, False, {"result_limit": True}, ok, b"", 1 << 20)
    assert v.status is Status.OUTPUT_LIMIT
    # memory error in a call
    mem = rec({"k": "start"}, {"k": "t", "i": 0, "exc": "MemoryError", "msg": ""})
    assert grading.grade(tests, False, {}, mem, b"", 1 << 20).status is Status.MEMORY
