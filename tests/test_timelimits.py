"""Per-problem wall limits from the reference solutions (grpo_jax.codegen.timelimits) and their effect."""

from __future__ import annotations

import dataclasses
import time

import pytest

from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.codegen.timelimits import with_reference_time_limits
from grpo_jax.problem import Problem
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits, Status
from grpo_jax.sandbox.types import TestCase as TC


def _p(tid: str, ref: str) -> Problem:
    return Problem(tid, "", "f", ref, tests=(TC("f(1)", 2),), completion_mode="program")


QUICK = _p("quick", "def f(x):\n    return x + 1\n")
SLOW = _p("slow", "import time\ndef f(x):\n    time.sleep(0.3)\n    return x + 1\n")
BROKEN = _p("broken", "def f(x):\n    return 0\n")
NOREF = _p("noref", "")


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=Limits(wall_s=3.0, cpu_s=3)) as e:
        yield e


def test_limits_from_reference_times_cached(ex, tmp_path):
    cache = tmp_path / "times.json"
    probs, rep = with_reference_time_limits(
        ex, [QUICK, SLOW, BROKEN, NOREF], floor_s=0.4, factor=4.0, cache=cache
    )
    quick, slow, broken, noref = (p.time_limit_s for p in probs)
    assert quick == 0.4  # a few ms x 4 is under the floor
    assert 1.2 <= slow < 3.0  # 4 x (0.3 s + the program's start), under the cap
    assert broken == 3.0 and noref == 3.0  # no passing reference: the executor's limit
    assert rep["measured"] == 3 and rep["failed_reference"] == 1 and rep["no_reference"] == 1
    assert rep["cap_s"] == 3.0 and rep["min_s"] == 0.4 and rep["max_s"] == 3.0
    again, rep2 = with_reference_time_limits(ex, [QUICK, SLOW, BROKEN], floor_s=0.4, factor=4.0, cache=cache)
    assert rep2["measured"] == 0 and rep2["cached"] == 3  # measured once, then read from the cache
    assert [p.time_limit_s for p in again] == [quick, slow, broken]
    with pytest.raises(ValueError, match="floor_s > 0"):
        with_reference_time_limits(ex, [QUICK], floor_s=0.0, cache=cache)


def test_a_per_problem_limit_bounds_a_loop(ex, tmp_path):
    (quick,), _ = with_reference_time_limits(ex, [QUICK], floor_s=0.4, cache=tmp_path / "t.json")
    loop = "def f(x):\n    while True:\n        pass\n"
    t0 = time.monotonic()
    v_tight, v_fixed = ex.run(jobs_for([quick, QUICK], [loop + "# a\n", loop + "# b\n"]))
    assert v_tight.status is Status.TIMEOUT and v_fixed.status is Status.TIMEOUT
    assert v_tight.seconds < 1.2 < 2.5 < v_fixed.seconds  # 0.4 s limit vs the executor's 3 s
    assert time.monotonic() - t0 < 8
    # never looser than the executor's own limit
    (looser,) = ex.run(jobs_for([dataclasses.replace(QUICK, time_limit_s=99.0)], [loop]))
    assert looser.status is Status.TIMEOUT and looser.seconds < 4.5


def test_a_stdin_stdout_problems_limit_comes_from_its_slowest_test(ex, tmp_path):
    """Each stdin/stdout test is a run of its own under the problem's wall limit, so the limit is factor x the
    slowest test's time: from the whole job's time (4 tests of 0.3 s) it would be 4 times too loose."""
    ref = "import time\ntime.sleep(0.3)\nprint(int(input()) + 1)\n"
    tests = tuple(TC("", str(i + 1) + "\n", kind="stdout", stdin=f"{i}\n") for i in range(4))
    stdio = Problem("stdio", "", "", ref, tests=tests, completion_mode="program", test_kind="stdio")
    (p,), rep = with_reference_time_limits(ex, [stdio], floor_s=0.4, factor=4.0, cache=tmp_path / "t.json")
    assert rep["measured"] == 1 and rep["failed_reference"] == 0
    assert (
        1.2 <= p.time_limit_s < 2.0
    )  # 4 x (0.3 s + start); the whole job's 4 x 1.2+ s would hit the 3 s cap
    (v,) = ex.run(jobs_for([p], [ref]))
    assert v.passed and len(v.tests) == 4


def test_the_cache_key_of_a_set_valued_test_is_the_same_in_every_process():
    """A set's repr follows the string-hash seed of its process: the key of a problem whose test expects a
    set must not (MBPP's Mbpp/945 was measured again, and cached again, by every run)."""
    import subprocess
    import sys

    code = (
        "from grpo_jax.codegen.timelimits import _key\n"
        "from grpo_jax.problem import Problem\n"
        "from grpo_jax.sandbox.types import TestCase as TC\n"
        "t = TC(\"f(('x', 'y', 'z'))\", {'x', 'y', 'z', 'w', 'v'})\n"
        "print(_key(Problem('p', '', 'f', 'def f(t):\\n    return set(t)\\n', tests=(t,)), 'tier'))\n"
    )
    keys = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)},
        ).stdout.strip()
        for seed in range(6)
    }
    assert len(keys) == 1, keys
    plain = _p("plain", "def f(x):\n    return x + 1\n")  # values without a set keep their keys
    from grpo_jax.codegen.timelimits import _key, _stable_repr

    assert _stable_repr(2) == "2" and _stable_repr([1, (2, "a")]) == repr([1, (2, "a")])
    assert _stable_repr({"b", "a"}) == _stable_repr({"a", "b"}) == '{"s": ["a", "b"]}'
    assert _key(plain, "t") == _key(plain, "t")
