"""Executor API: verdict contract, per-test results, child checks, cache, deadline, crash recovery, tiers."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.problem import Problem
from grpo_jax.sandbox.executor import Executor, _Slot
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


CHECK = "def check(c):\n    assert c(1) == 2\n    assert c(-1) == 0\n\ncheck(inc)\n"
INC = "def inc(x):\n    return x + 1\n"
# every one of these must score 0 against the child check above (two-process checker: docs/SANDBOX.md,
# _zygote.py)
CHILD_HACKS = {
    "always_equal_int": """
class E(int):
    def __eq__(self, o):
        return True
    __hash__ = int.__hash__
def inc(x):
    return E(7)
""",
    "always_equal_object": """
class E:
    def __eq__(self, o):
        return True
    def __bool__(self):
        return True
def inc(x):
    return E()
""",
    "sys_exit_in_call": "import sys\ndef inc(x):\n    sys.exit(0)\n",
    "os_exit_in_call": "import os\ndef inc(x):\n    os._exit(0)\n",
    "os_exit_at_import": "import os\nos._exit(0)\n",
    "raise_systemexit": "def inc(x):\n    raise SystemExit(0)\n",
    # forged records on every fd, then exit before the check can run
    "forged_records": """
import os
for fd in range(64):
    try:
        os.write(fd, b'{"k": "start"}\\n{"k": "check", "ok": true}\\n{"k": "done"}\\n')
    except OSError:
        pass
os._exit(0)
""",
    # the check text is never in the program's process: neither in its objects nor in its own memory
    "read_expected_gc": """
import gc
def inc(x):
    for o in gc.get_objects():
        if isinstance(o, str) and 'assert c(1) ==' in o:
            return int(o.split('==')[1].split()[0])
    return -1
""",
    "read_expected_memory": """
import re
def inc(x):
    f = open('/proc/self/mem', 'rb')
    for line in open('/proc/self/maps').read().splitlines():
        a, b = (int(v, 16) for v in line.split()[0].split('-'))
        if 'rw' not in line.split()[1]:
            continue
        try:
            f.seek(a)
            blob = f.read(b - a)
        except OSError:
            continue
        hit = re.search(rb'assert c\\(1\\) == (\\d+)', blob)
        if hit:
            return int(hit.group(1)) + (x - 1)
    return -1
""",
    "read_checker_memory": """
import os
def inc(x):
    try:
        return len(open(f'/proc/{os.getppid()}/mem', 'rb').read(1))
    except OSError:
        return -1
""",
    "monkeypatch_builtins": """
import builtins, math, operator
builtins.AssertionError = type('X', (BaseException,), {})
operator.eq = lambda a, b: True
math.isclose = lambda *a, **k: True
def inc(x):
    return 0
""",
    "kill_checker": "import os, signal\ndef inc(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n",
}


def test_child_check_class(ex):
    check = "def check(c):\n    assert c(1) == 2\n\ncheck(inc)\n"
    bad = "def check(c):\n    assert c(1) == 3\n\ncheck(inc)\n"
    v = ex.run(
        [
            Job(INC, (), child_check=check),
            Job(INC, (), child_check=bad),
            Job("import sys\nsys.exit(0)\n", (), child_check=check),
            Job("def inc(x):\n    import os; os._exit(0)\n", (), child_check=check),
            Job(INC + "print('hi')\n", (TC("inc(1)", 2),), child_check=check),  # both classes in one job
            Job(INC, (TC("inc(1)", 3),), child_check=check),
        ]
    )
    assert v[0].passed and v[0].child_check_passed is True
    assert v[1].status is Status.WRONG_ANSWER and v[1].child_check_passed is False
    assert not v[2].passed and not v[3].passed
    assert v[4].passed and v[4].tests[0].passed and v[4].child_check_passed is True
    assert v[5].status is Status.WRONG_ANSWER and not v[5].tests[0].passed and v[5].child_check_passed is True


def test_a_program_cannot_stand_in_for_the_builtins_a_child_check_calls(ex):
    """The checker binds the program's names into the check's namespace, but never one that shadows a builtin
    (a program's own `len` would answer the check's `len(...)`) and never a dunder name."""
    check = "r = inc(1)\nassert len(r) == 3 and sorted(r) == [1, 1, 1]\n"
    right = "def inc(x):\n    return [x, x, x]\n"
    wrong = "def inc(x):\n    return [x]\n"
    shadow = wrong + "def len(x):\n    return 3\ndef sorted(x):\n    return [1, 1, 1]\n"
    dunder = wrong + "__builtins__ = {'len': lambda x: 3, 'sorted': lambda x: [1, 1, 1]}\n"
    v = ex.run([Job(p, (), child_check=check) for p in (right, wrong, shadow, dunder)])
    assert [x.child_check_passed for x in v] == [True, False, False, False], [x.detail for x in v]


def test_child_check_hacks_score_zero(ex):
    names = list(CHILD_HACKS)
    vs = ex.run(
        [Job(CHILD_HACKS[n], (), child_check=CHECK) for n in names] + [Job(INC, (), child_check=CHECK)]
    )
    got = {n: (v.status.value, v.detail[:120]) for n, v in zip(names, vs, strict=False) if v.passed}
    assert not got, got
    assert all(v.status is not Status.INFRA_ERROR for v in vs), [v.detail for v in vs]
    assert vs[-1].passed  # the honest program still passes


def test_child_check_objects_stay_in_the_program(ex):
    prog = (
        "class Node:\n    def __init__(self, v, nxt=None):\n        self.v, self.nxt = v, nxt\n"
        "def total(n):\n    return 0 if n is None else n.v + total(n.nxt)\n"
        "def make(k):\n    return Node(k, Node(k))\n"
    )
    ok = "n = Node(1, Node(2))\nassert total(n) == 3\nassert total(make(4)) == 8\nassert n == n\n"
    truthy = "assert make(1)\n"  # an object of the program has no truth value in the checker
    v = ex.run([Job(prog, (), child_check=ok), Job(prog, (), child_check=truthy)])
    assert v[0].passed, v[0].detail
    assert not v[1].passed and "no truth value" in v[1].detail


def test_expected_values_from_the_oracle(ex):
    big = TC("add(10**12, 1)", None, kind="eq", expected_expr="10 ** 12 + 1")
    pi = TC(
        "add(0.5, 0.5)",
        None,
        kind="isclose",
        expected_expr="(math.pi / math.pi, 1e-09, 0.0)",
        prelude="import math",
    )
    raises = TC("add(1, 1)", None, expected_expr="1 / 0")
    odd = TC("add(1, 1)", None, expected_expr="object()")
    before = ex.stats()["oracle_runs"]
    v = ex.run([Job(ADD, (big, pi)), Job("def add(a, b):\n    return 0\n", (big,)), Job(ADD, (raises, odd))])
    assert v[0].passed and [t.passed for t in v[0].tests] == [True, True]
    assert v[1].status is Status.WRONG_ANSWER
    assert not v[2].passed and "raised ZeroDivisionError" in v[2].tests[0].error
    assert "not plain data" in v[2].tests[1].error
    runs = ex.stats()["oracle_runs"] - before
    assert runs >= 2  # one per prelude at least ("" and "import math")
    (again,) = ex.run([Job(ADD + "# again\n", (big, pi))])
    assert again.passed, again.detail  # answered from the cache: the same values
    assert ex.stats()["oracle_runs"] - before == runs  # cached for the executor's lifetime


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


def test_malformed_requests_give_one_infra_error(ex, monkeypatch):
    """The zygote parses a request's header only (the job's text goes into memfds, parsed by the child): a
    broken header or a size beyond its bounds ends the slot (restarted, retried once: infra_error), a
    malformed payload is the child's set-up error; never a hang, and the slot works afterwards."""

    def raw(header=None, payload=b"", length=None, **sizes):
        def send(self, req, check=b"", stdin=b""):
            h = (
                header
                or json.dumps({"op": "run", "id": req["id"], "limits": req["limits"], **sizes}).encode()
            )
            self.proc.stdin.write(struct.pack("!I", len(h) if length is None else length) + h + payload)
            self.proc.stdin.flush()

        return send

    bad = {
        "huge_header_length": raw(b"{", length=1 << 30),
        "header_not_json": raw(b"{nope"),
        "header_not_an_object": raw(b"[1, 2]"),
        "no_payload_len": raw(),
        "payload_len_beyond_bound": raw(payload_len=1 << 40),
        "negative_check_len": raw(payload=b"{}", payload_len=2, check_len=-1),
        "payload_not_json": raw(payload=b"{nope", payload_len=5),
        "payload_not_an_object": raw(payload=b"[]", payload_len=2),
    }
    for name, send in bad.items():
        with monkeypatch.context() as m:
            m.setattr(_Slot, "_send_request", send)
            t0 = time.monotonic()
            got = ex.run([Job(ADD + f"# {name}\n", T_ADD)])
        assert [v.status for v in got] == [Status.INFRA_ERROR], (name, got)
        assert time.monotonic() - t0 < 5, name
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


MEMORY_TREE = """
import os, time
def f(x):
    pids = []
    for i in range(6):  # 6 x 700 MiB, each child under its own RLIMIT_AS: only a group limit stops the tree
        p = os.fork()
        if p == 0:
            b = bytearray(700 << 20)
            for j in range(0, len(b), 4096):
                b[j] = 1
            time.sleep(3)
            os._exit(0)
        pids.append(p)
    return [os.waitpid(p, 0)[1] for p in pids]
"""


def test_cgroup_limits_where_available():
    with Executor(num_workers=1, limits=Limits(wall_s=8.0, cpu_s=8)) as e:
        cg = e.tier_report()["cgroup"]
        line = e.tier_line()
        if not cg["active"]:
            assert "no cgroup limits (" in line and cg["why"]
            pytest.skip(f"no cgroup limits on this machine: {cg['why']}")
        assert f"cgroup {cg['version']}: memory {cg['memory_bytes'] >> 20} MiB" in line
        assert cg["memory_bytes"] == (1 << 30) + (256 << 20) and cg["pids"] == 32 + 8
        assert e.tier_report()["active"]["cgroup_memory_pids"]  # the probe child found itself in the group
        v = e.run([Job(MEMORY_TREE, (TC("f(1)", [0] * 6),))])[0]
        assert v.status is Status.MEMORY and "cgroup memory limit" in v.detail, v
        assert e.stats()["cgroup_oom_kills"] == 1
        assert e.run([Job(ADD, T_ADD)])[0].passed  # the slot survives its group's OOM kills
    assert "left_behind" not in e.tier_report()["cgroup"]  # the groups are removed on close


def test_stale_cgroups_of_dead_executors_are_swept(tmp_path):
    """An executor killed with SIGKILL cannot remove its groups; the next one removes those of dead pids."""
    from grpo_jax.sandbox import cgroups

    dead = tmp_path / "grpo_jax_sandbox_999999999_0"
    mine = tmp_path / f"grpo_jax_sandbox_{os.getpid()}_0"
    other = tmp_path / "unrelated"
    for d in (dead / "slot0", dead / "slot1", mine / "slot0", other / "slot0"):
        d.mkdir(parents=True)
    assert cgroups._sweep_stale(tmp_path) == 1
    assert not dead.exists() and mine.exists() and other.exists()
