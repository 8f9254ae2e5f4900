"""Executor API: verdict contract, per-test results, child checks, cache, deadline, crash recovery, tiers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.problem import Problem
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Job, Limits, Status
from grpo_jax.sandbox.types import TestCase as TC

LIM = Limits(wall_s=2.0, cpu_s=2)
ADD = "def add(a, b):\n    return a + b\n"
T_ADD = (TC("add(1, 2)", 3), TC("add(2, 2)", 4), TC("add('a', 'b')", "ab"))


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=LIM) as e:
        yield e


def test_importing_sandbox_does_not_import_jax():
    code = "import grpo_jax.sandbox.executor, grpo_jax.codegen.datasets, sys; print('jax' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert out.stdout.strip() == "False"


def test_tier_report_matches_reality(ex):
    rep = ex.tier_report()
    assert rep["tier"] == ex.tier
    probe = rep["probe"]
    if os.geteuid() == 0:
        assert ex.tier == "namespaces+uid+seccomp", rep
        assert probe["pid"] == 2 and probe["net_ifaces"] == ["lo"] and probe["uid"] >= 61000
        assert probe["status"]["Seccomp"] == "2" and probe["status"]["NoNewPrivs"] == "1"
        assert not probe["home_visible"]
    for k, v in rep["active"].items():
        assert (k in rep["missing"]) == (not v)
    assert rep["active"]["cleared_env"] and set(probe["env"]) <= {"PATH", "LANG", "HOME", "TMPDIR"}


def test_statuses_and_per_test_results(ex):
    jobs = [
        Job(ADD, T_ADD),
        Job("def add(a, b):\n    return b + a\n", T_ADD),
        Job("def add(a, b):\n    if a == 2:\n        raise ValueError('x')\n    return a + b\n", T_ADD),
        Job("def add(a, b)\n    return a\n", T_ADD),
        Job("def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n", T_ADD),
        Job("def add(a, b):\n    return True\n", (TC("add(0, 1)", 1),)),  # bool is not int
        Job("def add(a, b):\n    return (a, b)\n", (TC("add(0, 1)", [0, 1]),)),  # tuple is not list
        Job("def add(a, b):\n    return 3.0\n", (TC("add(1, 2)", 3),)),  # int/float widening
        Job("def add(a, b):\n    return 0.1 + 0.2\n", (TC("add(1, 2)", 0.3, float_tol=1e-9),)),
    ]
    v = ex.run(jobs)
    assert [x.status for x in v] == [
        Status.PASSED,
        Status.WRONG_ANSWER,
        Status.RUNTIME_ERROR,
        Status.SYNTAX_ERROR,
        Status.TIMEOUT,
        Status.WRONG_ANSWER,
        Status.WRONG_ANSWER,
        Status.PASSED,
        Status.PASSED,
    ]
    assert v[0].passed and v[0].tests_passed == 3
    # a raising call does not hide later tests
    assert [t.status for t in v[2].tests] == [Status.PASSED, Status.RUNTIME_ERROR, Status.PASSED]
    assert "ValueError" in v[2].tests[1].error
    # a timeout ends the rest: remaining tests are TIMEOUT
    assert [t.status for t in v[4].tests] == [Status.PASSED, Status.TIMEOUT, Status.TIMEOUT]
    assert v[4].seconds < LIM.wall_s + 3


def test_child_check_class(ex):
    prog = "def inc(x):\n    return x + 1\n"
    check = "def check(c):\n    assert c(1) == 2\n\ncheck(inc)\n"
    bad = "def check(c):\n    assert c(1) == 3\n\ncheck(inc)\n"
    v = ex.run(
        [
            Job(prog, (), child_check=check),
            Job(prog, (), child_check=bad),
            Job("import sys\nsys.exit(0)\n", (), child_check=check),
            Job("def inc(x):\n    import os; os._exit(0)\n", (), child_check=check),
        ]
    )
    assert v[0].passed and v[0].child_check_passed is True
    assert v[1].status is Status.WRONG_ANSWER and v[1].child_check_passed is False
    assert not v[2].passed and not v[3].passed


def test_cache_and_duplicates(ex):
    before = ex.stats()["cache_hits"]
    job = Job(ADD + "# cache test\n", T_ADD)
    v1 = ex.run([job, job])
    v2 = ex.run([job])
    assert v1[0].passed and v1[1].passed and v2[0].passed and v2[0].cached
    assert ex.stats()["cache_hits"] == before + 1


def test_batch_deadline(ex):
    loop = "def add(a, b):\n    while True:\n        pass\n"
    jobs = [Job(loop + f"# {i}\n", T_ADD) for i in range(8)]
    t0 = time.monotonic()
    v = ex.run(jobs, deadline_s=1.0)
    assert time.monotonic() - t0 < 1.0 + 3
    assert len(v) == 8 and all(x.status is Status.TIMEOUT for x in v)


def test_run_never_raises(ex):
    v = ex.run([Job(None, ()), Job(ADD, T_ADD)])  # type: ignore[arg-type]
    assert v[0].status is Status.INFRA_ERROR and v[1].passed
    assert ex.run([]) == []


def test_jobs_for_uses_problem_fields():
    p = Problem(
        "t/1",
        "def f(x):\n",
        "f",
        "def f(x):\n    return x\n",
        tests=(TC("f(1)", 1),),
        child_check="assert f(2) == 2",
        setup_code="Y = 1",
        completion_mode="append",
    )
    jobs = jobs_for([p], ["    return x\n", "    return 0\n"])
    assert len(jobs) == 2 and jobs[0].program == "def f(x):\n    return x\n"
    assert jobs[0].child_check == p.child_check and jobs[0].setup_code == "Y = 1" and jobs[0].tests == p.tests
    with pytest.raises(ValueError):
        jobs_for([p, p], ["a", "b", "c"])


def test_worker_killed_mid_batch():
    """Kill a zygote while it runs a program: every job still gets exactly one verdict, no hang."""
    with Executor(num_workers=2, limits=LIM) as ex:
        jobs = [Job(f"import time\ntime.sleep(0.3)\n{ADD}# {i}\n", T_ADD) for i in range(12)]
        result = {}

        def go():
            result["v"] = ex.run(jobs)

        th = threading.Thread(target=go)
        th.start()
        time.sleep(0.5)
        for pid in ex._zygote_pids()[:1]:
            os.kill(pid, signal.SIGKILL)
        th.join(timeout=60)
        assert not th.is_alive()
        v = result["v"]
        assert len(v) == 12
        assert all(x.passed or x.status is Status.INFRA_ERROR for x in v)
        assert sum(x.passed for x in v) >= 11
        st = ex.stats()
        assert st["restarts"] >= 1
        assert any(x.retried for x in v)
        # still healthy afterwards
        assert ex.run([Job(ADD + "# after\n", T_ADD)])[0].passed


def test_rlimits_only_tier_is_honest():
    with Executor(num_workers=1, limits=LIM, tier="rlimits-only") as ex:
        rep = ex.tier_report()
        assert ex.tier in ("rlimits-only", "seccomp+rlimits")
        assert not rep["active"]["pid_namespace"] and "pid_namespace" in rep["missing"]
        assert not rep["active"]["network_namespace"]
        v = ex.run(
            [
                Job(ADD, T_ADD),
                Job(
                    "class E(int):\n    def __eq__(s, o):\n        return True\n"
                    "def add(a, b):\n    return E(0)\n",
                    T_ADD[:1],
                ),
                Job("import os\nos._exit(0)\n", T_ADD),
                Job("while True:\n    pass\n", T_ADD),
            ]
        )
        assert [x.status for x in v] == [
            Status.PASSED,
            Status.WRONG_ANSWER,
            Status.RUNTIME_ERROR,
            Status.TIMEOUT,
        ]


def test_unknown_tier_rejected():
    with pytest.raises(ValueError):
        Executor(num_workers=1, tier="bogus")
