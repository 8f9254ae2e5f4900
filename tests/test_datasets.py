"""HumanEval and MBPP load into `Problem`; the references pass through the executor and broken ones fail."""

from __future__ import annotations

import collections
import gzip
import json
import time

import pytest

from grpo_jax import data
from grpo_jax.codegen import datasets
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.sandbox.asserts import split_check
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits
from grpo_jax.sandbox.types import TestCase as TC

# a wrapper that keeps the canonical solution but changes every return value (the "made wrong" variant)
WRONG = """

def _grpo_wrong(r):
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1
    if isinstance(r, str):
        return r + "x"
    if isinstance(r, list):
        return r + [None]
    if isinstance(r, tuple):
        return r + (None,)
    if r is None:
        return 0
    return None


_grpo_orig = {name}


def {name}(*args, **kwargs):
    return _grpo_wrong(_grpo_orig(*args, **kwargs))
"""


def test_humaneval_loads():
    probs = datasets.load_humaneval()
    assert len(probs) == 164
    p = probs[0]
    assert p.task_id == "HumanEval/0" and p.completion_mode == "append" and p.source == "humaneval"
    # check(candidate) split per assert, candidate bound to the entry point, nothing left child-side
    assert p.child_check is None and len(p.tests) == 7
    assert p.tests[0] == TC(
        call="has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3)",
        expected=True,
        source="assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True",
    )
    assert p.reference.startswith(p.prompt)
    assert data.load(datasets.humaneval_path())[5] == probs[5]
    by = {q.task_id: q for q in probs}
    # what cannot be split (a loop over random inputs) stays child-side, after the prompt's own helper
    p32 = by["HumanEval/32"]
    assert p32.child_check.startswith("import math\n\ndef poly(") and p32.child_check.rstrip().endswith(
        "check(find_zero)"
    )
    assert sum(q.child_check is None for q in probs) == 157  # fully parent-graded (0 before the split)


def test_humaneval_check_split_shapes():
    code = (
        "import math\n\ndef check(candidate):\n"
        "    assert candidate(1) == 10**12 + 1\n"  # non-literal expected: left to the executor's oracle
        "    assert abs(candidate(2) - 0.5) < 1e-6\n"
        "    assert not candidate(3)\n"
        "    assert True, 'always'\n"
        "    x = candidate(4)\n"
        "    assert x == 4\n"  # a local: stays child-side
        "    assert math.isclose(candidate(5), math.pi, rel_tol=1e-3)\n"
    )
    sc = split_check(code, "f")
    assert [t.kind for t in sc.tests] == ["eq", "abs_lt", "falsy", "isclose"]
    assert [t.call for t in sc.tests] == ["f(1)", "f(2)", "f(3)", "f(5)"]
    assert sc.tests[0].expected_expr == "10 ** 12 + 1" and sc.tests[0].prelude == "import math"
    assert sc.tests[1].expected == (0.5, 1e-06)
    assert sc.tests[3].expected_expr == "(math.pi, 0.001, 0.0)"
    assert sc.child_statements == 2
    assert "x = candidate(4)" in sc.child_check and "assert x == 4" in sc.child_check
    assert "assert not candidate(3)" not in sc.child_check and sc.child_check.rstrip().endswith("check(f)")


def test_mbpp_loads_with_splits():
    probs = datasets.load_mbpp()
    assert len(probs) == 974
    counts = collections.Counter(p.split for p in probs)
    assert counts == {"prompt": 10, "test": 500, "validation": 90, "train": 374}
    assert len(datasets.load_mbpp(split="validation")) == 90
    with pytest.raises(ValueError):
        datasets.load_mbpp(split="dev")
    by = {p.task_id: p for p in probs}
    p = by["Mbpp/2"]
    assert (
        p.completion_mode == "program" and p.source == "mbpp" and len(p.tests) == 3 and p.child_check is None
    )
    assert "\r" not in p.reference and p.program_for("x = 1") == "x = 1"
    assert by["Mbpp/367"].setup_code.strip()
    # parent-graded: the expected values are plain data
    assert all(isinstance(t.call, str) for p in probs for t in p.tests)


def test_mbpp_per_assert_fallback_to_child_check(tmp_path):
    row = {
        "task_id": 1,
        "text": "t",
        "code": "def f(x):\n    return x\n",
        "test_list": [
            "assert f(1) == 1",
            "assert math.isclose(f(1.0), 1.0)",
            "assert f(10**12) == 10**12",
            "assert f(1) == f(1)",  # both sides run the candidate: child-side
        ],
        "test_setup_code": "import math",
    }
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (p,) = data.load(path)
    assert [t.kind for t in p.tests] == ["eq", "isclose", "eq"]
    assert p.tests[1].expected == (1.0, 1e-09, 0.0) and p.tests[2].expected_expr == "10 ** 12"
    assert p.child_check == "import math\nassert f(1) == f(1)\n"
    # a solution named like a builtin is still the candidate (Mbpp/126 defines `sum`)
    row2 = dict(row, code="def sum(a, b):\n    return a + b\n", test_list=["assert sum(1, 2) == 3"])
    path.write_text(json.dumps(row2) + "\n")
    (p2,) = data.load(path)
    assert p2.tests == (TC(call="sum(1, 2)", expected=3, source="assert sum(1, 2) == 3"),)
    path.write_text(json.dumps(row) + "\n")
    gz = tmp_path / "m.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps(row) + "\n")
    assert data.load(gz) == [p]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": 1}\n')
    with pytest.raises(ValueError, match="neither HumanEval"):
        data.load(bad)


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=4, limits=Limits(wall_s=8.0, cpu_s=8)) as e:
        yield e


def test_humaneval_canonical_pass_and_wrong_fail(ex):
    probs = datasets.load_humaneval()
    t0 = time.monotonic()
    good = ex.run(jobs_for(probs, [p.reference[len(p.prompt) :] for p in probs]))
    bad_completions = [p.reference[len(p.prompt) :] + WRONG.format(name=p.entry_point) for p in probs]
    bad = ex.run(jobs_for(probs, bad_completions))
    secs = time.monotonic() - t0
    failed_good = [
        (p.task_id, v.status.value, v.detail[:100]) for p, v in zip(probs, good, strict=True) if not v.passed
    ]
    passed_bad = [p.task_id for p, v in zip(probs, bad, strict=True) if v.passed]
    print(
        f"HumanEval: canonical {sum(v.passed for v in good)}/164 pass, "
        f"wrong {sum(not v.passed for v in bad)}/164 "
        f"fail, {secs:.1f}s"
    )
    assert not failed_good
    assert not passed_bad


def test_humaneval_docstring_examples_are_public_tests_the_canonical_passes(ex):
    """The docstring's doctest examples become public tests (multi-turn feedback shows them; grading stays on
    check(candidate)): literal cases, then every canonical solution passes its examples in the sandbox (the
    run execution feedback makes, feedback.public_jobs) and a made-wrong one fails them. Three examples the
    canonical solutions contradict (datasets.HUMANEVAL_WRONG_EXAMPLES) are left out; this run finds any
    other such example."""
    from grpo_jax.codegen import feedback

    probs = datasets.load_humaneval()
    by = {q.task_id: q for q in probs}
    assert by["HumanEval/0"].public_tests == (
        TC(
            call="has_close_elements([1.0, 2.0, 3.0], 0.5)",
            expected=False,
            source=">>> has_close_elements([1.0, 2.0, 3.0], 0.5)",
        ),
        TC(
            call="has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)",
            expected=True,
            source=">>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)",
        ),
    )
    # an escape inside a string example stays in it; `>>> CALL == LITERAL` without an output line
    assert by["HumanEval/51"].public_tests[1].call == 'remove_vowels("abcdef\\nghijklm")'
    assert by["HumanEval/51"].public_tests[1].expected == "bcdf\nghjklm"
    assert [(t.call, t.expected) for t in by["HumanEval/108"].public_tests] == [
        ("count_nums([])", 0),
        ("count_nums([-1, 11, -11])", 1),
        ("count_nums([1, 1, 2])", 3),
    ]
    # skipped: no output (12's `longest([])`), a non-literal output line, a call wrapped in round() (32)
    assert len(by["HumanEval/12"].public_tests) == 2 and by["HumanEval/32"].public_tests == ()
    assert all(q.graded_public is False and q.hidden_tests == q.tests for q in probs)
    with_examples = [q for q in probs if q.public_tests]
    assert (len(with_examples), sum(len(q.public_tests) for q in with_examples)) == (74, 175)
    # the dataset's wrong examples (errata) are left out: 47 keeps its right one, 116 has none left
    assert [t.call for t in by["HumanEval/47"].public_tests] == ["median([3, 1, 2, 4, 5])"]
    assert by["HumanEval/116"].public_tests == ()
    programs = [q.reference for q in with_examples]
    good = ex.run(feedback.public_jobs(with_examples, programs))
    assert [q.task_id for q, v in zip(with_examples, good, strict=True) if not v.passed] == []
    wrong = [q.reference + WRONG.format(name=q.entry_point) for q in with_examples]
    bad = ex.run(feedback.public_jobs(with_examples, wrong))
    assert [q.task_id for q, v in zip(with_examples, bad, strict=True) if v.passed] == []


# MBPP's "made wrong" variant: the reference runs, then the entry point is redefined to call it and return an
# object that no test can accept (not plain data; every conversion, comparison or access on it raises).
MBPP_WRONG = """


class _GrpoWrong:
    def _no(self, *args, **kwargs):
        raise TypeError("a made-wrong result")

    __bool__ = __len__ = __iter__ = __getitem__ = __contains__ = __str__ = __repr__ = __format__ = _no
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __index__ = __int__ = __float__ = _no
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __round__ = __abs__ = __neg__ = _no


_grpo_orig = {name}


def {name}(*args, **kwargs):
    _grpo_orig(*args, **kwargs)
    return _GrpoWrong()
"""

MBPP_PASS_FLOOR = 969  # measured: 970/974 (the known failures below, less 123 unless the machine is loaded)


def test_mbpp_references_mostly_pass_and_wrong_ones_fail(ex):
    probs = datasets.load_mbpp()
    graded = [p for p in probs if p.tests]  # parent-graded problems (all 974 of the bundled copy)
    assert len(graded) >= 970 and all(p.entry_point for p in graded)
    t0 = time.monotonic()
    vs = ex.run(jobs_for(probs, [p.reference for p in probs]))
    bad = ex.run(jobs_for(graded, [p.reference + MBPP_WRONG.format(name=p.entry_point) for p in graded]))
    secs = time.monotonic() - t0
    passed = sum(v.passed for v in vs)
    failed = {p.task_id for p, v in zip(probs, vs, strict=True) if not v.passed}
    passed_bad = [p.task_id for p, v in zip(graded, bad, strict=True) if v.passed]
    print(
        f"MBPP: references {passed}/{len(probs)} pass (failed: {sorted(failed)}), "
        f"made-wrong {len(graded) - len(passed_bad)}/{len(graded)} fail, {secs:.1f}s"
    )
    assert not passed_bad, f"{len(passed_bad)} made-wrong programs passed: {passed_bad[:20]}"
    # known: 341/642 (set order), 596 (sys.getsizeof), 414 (returns 1/0 where the test says True/False:
    # bool is not int under strict grading), 123 may time out on a loaded machine
    assert failed <= {"Mbpp/341", "Mbpp/642", "Mbpp/596", "Mbpp/414", "Mbpp/123"}, failed
    assert "Mbpp/414" in failed  # strict grading: 1 is not True
    assert passed >= MBPP_PASS_FLOOR, (passed, sorted(failed))
