"""stdin/stdout tests, call-based json_eq tests and Job.stop_on_failure through the real executor.

One executor for the module (the sandbox of a TINY run: 2 slots, 2 s wall); each group of programs is one
batch. Expected values are literals. docs/SANDBOX.md §3.7 is the specification.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import signal
import threading
import time

import mainjob
import pytest

from grpo_jax.sandbox import grading
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Job, Limits, Status
from grpo_jax.sandbox.types import TestCase as TC

P, WA, RE, TO, OL = (
    Status.PASSED,
    Status.WRONG_ANSWER,
    Status.RUNTIME_ERROR,
    Status.TIMEOUT,
    Status.OUTPUT_LIMIT,
)


def io(stdin: str, expected: str, **kw) -> TC:
    return TC(call="", kind="stdout", stdin=stdin, expected=expected, **kw)


@pytest.fixture(scope="module")
def ex():
    with mainjob.executor() as e:
        yield e


def run(ex, cases: dict[str, tuple[Job, Status]]) -> dict:
    """Run every job in one batch; {name: verdict}, after checking each status."""
    names = list(cases)
    verdicts = ex.run([cases[n][0] for n in names])
    got = dict(zip(names, verdicts, strict=True))
    bad = [f"{n}: {got[n].status} ({got[n].detail[:300]}), want {cases[n][1]}" for n in names]
    bad = [b for n, b in zip(names, bad, strict=True) if got[n].status is not cases[n][1]]
    assert not bad, "\n".join(bad)
    return got


# ------------------------------------------------------------------------------------------------------------
# The comparisons, in the parent (no processes)
# ------------------------------------------------------------------------------------------------------------
def test_stdout_comparison_rules():
    m = grading.stdout_matches
    passes = [
        ("3\n", "3\n"),
        ("3   \n", "3\n"),  # trailing spaces
        ("3", "3\n"),  # no final newline
        ("1\r\n2\r\n", "1\n2\n"),  # CRLF
        ("1\n2\n\n\n", "1\n2"),  # trailing blank lines
        ("\n3\n", "3\n"),  # a leading blank line: tokens
        ("1 2\n3\n", "1\n2 3\n"),  # line breaks are whitespace for tokens (testlib wcmp)
        ("0.3333333\n", "0.33333333\n"),  # within 1e-6
        ("1.0\n", "1\n"),  # Decimal-equal (LiveCodeBench)
        ("+5 -0\n", "5 0\n"),
        ("1000000.5\n", "1000000\n"),  # relative 1e-6 of 1e6
        ("1e-7\n", "0\n"),  # absolute 1e-6
        ("nan\n", "nan\n"),
        (b"caf\xc3\xa9\n", "café\n"),
        ("", ""),
        ("  \n", ""),
    ]
    for got, exp in passes:
        assert m(got, exp) == (True, ""), (got, exp)
    fails = [
        ("0.33\n", "0.333333\n"),
        ("50000000000000001\n", "50000000000000000\n"),  # integers exactly (the np.isclose gotcha)
        ("1000002\n", "1000000.0\n"),
        ("YES\n", "Yes\n"),
        ("1 2 3\n", "1 2\n"),
        ("nan\n", "NaN\n"),
        ("inf\n", "1e999\n"),
        ("0x10\n", "16\n"),
        ("", "0\n"),
        ("3\n", ""),
    ]
    for got, exp in fails:
        ok, why = m(got, exp)
        assert not ok and why, (got, exp)
    assert m("1 2 3", "1 2")[1] == "3 output tokens, expected 2"
    assert m("1 5\n", "1 6\n")[1] == "token 2: got '5', expected '6'"
    assert m("0.35\n", "0.3\n", float_tol=0.1) == (True, "")  # a test's own tolerance
    assert not m("0.35\n", "0.3\n")[0]


def test_json_eq_rules():
    def ok(got, exp, tol=0.0):
        return grading.check_value(TC("f()", exp, kind="json_eq", float_tol=tol), got)

    assert ok((1, 2), [1, 2]) and ok([(1, 2), (3,)], [[1, 2], [3]]) and ok({"a": (1,)}, {"a": [1]})
    assert ok(3.0, 3) and ok(3, 3.0) and ok(None, None) and ok("ab", "ab") and ok([], [])
    assert ok({1: "x"}, {1: "x"}) and not ok({1: "x"}, {"1": "x"})  # keys keep their types
    assert not ok(True, 1) and not ok(1, True) and not ok([True], [1]) and not ok(0, False)
    assert not ok(0.1 + 0.2, 0.3) and ok(0.1 + 0.2, 0.3, tol=1e-9)  # exact unless the test says
    assert not ok({1, 2}, [1, 2]) and not ok("1", 1) and not ok([1], 1) and not ok(1, [1])
    assert not ok([1, 2], [2, 1]) and not ok(b"a", "a")


def test_testcase_and_job_validation(ex):
    with pytest.raises(ValueError, match="call='', kind='stdout', stdin=<str>"):
        TC(call="f()", kind="stdout", stdin="1", expected="1")
    with pytest.raises(ValueError, match=r"stdin=NoneType \(must be the input text"):
        TC(call="", kind="stdout", expected="1")
    with pytest.raises(ValueError, match=r"expected=int \(must be the expected stdout text\)"):
        TC(call="", kind="stdout", stdin="", expected=1)
    with pytest.raises(ValueError, match="stdin= is only for kind='stdout' tests, not kind='json_eq'"):
        TC(call="f()", kind="json_eq", stdin="1", expected=1)
    with pytest.raises(ValueError, match="kind='json-eq' is not a comparison; valid: eq, ne"):
        TC(call="f()", kind="json-eq", expected=1)
    with pytest.raises(ValueError, match="kind='json_eq' needs call= a Python expression"):
        TC(call="", kind="json_eq", expected=1)
    mixed = (io("1", "1"), TC("f()", 1, kind="json_eq"))
    with pytest.raises(ValueError, match="mixes 1 stdin/stdout tests .* with 1 call tests"):
        Job("print(1)", mixed)
    with pytest.raises(ValueError, match="takes no child_check and no setup_code"):
        Job("print(1)", (io("", "1"),), setup_code="x = 1")
    with pytest.raises(ValueError, match="stop_on_failure must be a bool"):
        Job("print(1)", (io("", "1"),), stop_on_failure=1)
    # a Job that bypassed its constructor is refused by Executor.run's preparation, which never raises
    job = Job("print(1)", (io("", "1"),))
    object.__setattr__(job, "tests", mixed)
    big = Job(
        "print(1)", (io("", "1"), io("x" * 11, "1")), limits=Limits(wall_s=2.0, cpu_s=2, stdin_bytes=10)
    )
    v_mixed, v_big = ex.run([job, big])
    assert v_mixed.status is Status.INFRA_ERROR and "mixes 1 stdin/stdout tests" in v_mixed.detail
    assert v_big.status is Status.INFRA_ERROR
    assert v_big.detail == "test 1: stdin of 11 bytes exceeds Limits.stdin_bytes=10"


# ------------------------------------------------------------------------------------------------------------
# stdin/stdout programs that must pass
# ------------------------------------------------------------------------------------------------------------
AB = "a, b = map(int, input().split())\n"
BIG_N = 700_000  # numbers 0..BIG_N-1, one per line: 4.8 MB of input
BIG_INPUT = "".join(f"{i}\n" for i in range(BIG_N))


def test_stdio_must_pass(ex):
    assert len(BIG_INPUT) > 4_500_000
    add = (io("1 2\n", "3\n"), io("10 -4\n", "6\n"), io("0 0", "0"))
    cases = {
        "input": (Job(AB + "print(a + b)\n", add), P),
        "trailing_spaces": (Job(AB + "print(a + b, '  ')\n", add), P),
        "no_final_newline": (Job(AB + "import sys\nsys.stdout.write(str(a + b))\n", add), P),
        "crlf": (Job("import sys\nsys.stdout.write('1\\r\\n2\\r\\n')\n", (io("", "1\n2\n"),)), P),
        "float_tolerance": (Job("print('0.3333333')\n", (io("", "0.33333333\n"),)), P),
        "exit": (Job(AB + "print(a + b)\nexit()\nprint('more')\n", add), P),
        "quit": (Job(AB + "print(a + b)\nquit()\n", add), P),
        "sys_exit_0": (Job(AB + "import sys\nprint(a + b)\nsys.exit(0)\n", add), P),
        "raise_systemexit": (Job(AB + "print(a + b)\nraise SystemExit\n", add), P),
        "stdin_read": (Job("import sys\nprint(sum(map(int, sys.stdin.read().split())))\n", add), P),
        "stdin_buffer_read": (
            Job("import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n", add),
            P,
        ),
        "open_0": (Job("print(sum(map(int, open(0).read().split())))\n", add), P),
        "readline_loop": (
            Job("import sys\nfor line in sys.stdin:\n    print(sum(map(int, line.split())))\n", add),
            P,
        ),
        "main_guard_and_stderr": (
            Job(
                "import sys\ndef main():\n    a, b = map(int, sys.stdin.readline().split())\n"
                "    print('debug', a, b, file=sys.stderr)\n    print(a + b)\n"
                "if __name__ == '__main__':\n    main()\n",
                add,
            ),
            P,
        ),
        # the competitive-programming idiom: the work in a non-daemon thread with a big stack
        "thread_main": (
            Job(
                "import sys, threading, time\nsys.setrecursionlimit(100000)\nthreading.stack_size(1 << 26)\n"
                "def f(n):\n    return n if n == 0 else 1 + f(n - 1)\n"
                "def main():\n    n = int(input())\n    time.sleep(0.2)\n    print(f(n))\n"
                "threading.Thread(target=main).start()\n",
                (io("20000\n", "20000\n"),),
            ),
            P,
        ),
        "flush_then_os_exit": (
            Job(AB + "import os, sys\nprint(a + b)\nsys.stdout.flush()\nos._exit(0)\n", add),
            P,
        ),
        "atexit_prints": (Job(AB + "import atexit\natexit.register(print, a + b)\n", add), P),
        "big_input": (
            Job(
                "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n",
                (io(BIG_INPUT, "244999650000\n"),),
            ),
            P,
        ),
    }
    got = run(ex, cases)
    assert [t.status for t in got["input"].tests] == [P, P, P]


# ------------------------------------------------------------------------------------------------------------
# stdin/stdout programs that must fail
# ------------------------------------------------------------------------------------------------------------
# Looks for SECRET-xxxxxxxx everywhere a program can look: its input, argv, environment, every fd, /proc of
# every process (cmdline, environ, fds, memory), the files it can see, and its own memory (a fork of the
# zygote, which parsed the request). Prints what it found, or "none".
SCAN = r"""
import os, re, sys
pat = re.compile(b"SEC" + b"RET-[0-9a-f]{8}")
found = set()
def look(b):
    if isinstance(b, str):
        b = b.encode("utf-8", "replace")
    found.update(m.group().decode() for m in pat.finditer(b))
def read_path(p, n=1 << 22):
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        look(os.read(fd, n))
    except OSError:
        pass
    finally:
        os.close(fd)
def regions(pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
    except OSError:
        return
    for line in maps:
        addr, perms = line.split()[:2]
        if "r" in perms and "[v" not in line:
            lo, hi = (int(x, 16) for x in addr.split("-"))
            yield lo, hi
def read_mem(pid):
    try:
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        return
    with mem:
        for lo, hi in regions(pid):
            try:
                mem.seek(lo)
                look(mem.read(hi - lo))
            except (OSError, ValueError, OverflowError, MemoryError):
                pass
look(sys.stdin.buffer.read())
import ctypes  # its own memory (a fork of the zygote), read in place
for lo, hi in list(regions("self")):
    look(ctypes.string_at(lo, hi - lo))
look(repr(sys.argv))
look(repr(dict(os.environ)))
for fd in range(3, 256):
    try:
        look(os.read(fd, 1 << 20))
    except OSError:
        pass
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():  # its own fds were read above (its pipes' read ends
        # would only take its own records)
        read_path(f"/proc/{pid}/cmdline")
        read_path(f"/proc/{pid}/environ")
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            read_path(f"/proc/{pid}/fd/{fd}")
        read_mem(pid)
for root, dirs, files in os.walk("/"):
    if root in ("/proc", "/sys", "/usr", "/bin", "/sbin") or root.startswith("/lib"):
        dirs[:] = []
        continue
    for name in dirs + files:
        look(name)
        read_path(os.path.join(root, name), 1 << 20)
print(" ".join(sorted(found)) or "none")
"""


def test_stdio_must_fail(ex):
    add = (io("1 2\n", "3\n"), io("10 -4\n", "6\n"))
    secret = "SECRET-1a2b3c4d"
    big = "7\n" * 750000  # 1.5 MB
    loop = "n = int(input())\nwhile n == 2:\n    pass\nprint(n * n)\n"
    three = (io("1\n", "1\n"), io("2\n", "4\n"), io("3\n", "9\n"))
    # inputs of decreasing length: an earlier one would outlast a later one in a reused buffer
    isolated = tuple(
        io("pad " * 4 * (3 - k) + f"SECRET-0000000{k}\n", f"SECRET-0000000{k}\n") for k in range(3)
    )
    forge = (
        "import os\nfor fd in range(3, 64):\n    try:\n"
        '        os.write(fd, b\'{"k": "start"}\\n{"k": "t", "i": 0, "v": 3}\\n{"k": "done"}\\n\')\n'
        "    except OSError:\n        pass\nos._exit(0)\n"
    )
    cases = {
        "exit_before_print": (Job(AB + "import sys\nsys.exit(0)\nprint(a + b)\n", add), WA),
        "exit_1_after_print": (Job(AB + "import sys\nprint(a + b)\nsys.exit(1)\n", add), RE),
        "exit_message": (Job(AB + "import sys\nprint(a + b)\nsys.exit('bye')\n", add), RE),
        "raise_after_print": (Job(AB + "print(a + b)\nraise ValueError('x')\n", add), RE),
        "stderr_only": (Job(AB + "import sys\nprint(a + b, file=sys.stderr)\n", add), WA),
        "os_exit_unflushed": (Job(AB + "import os\nprint(a + b)\nos._exit(0)\n", add), WA),
        "os_exit_before_print": (Job(AB + "import os\nos._exit(0)\nprint(a + b)\n", add), WA),
        "forged_records": (Job(forge, add), WA),
        "huge_output": (Job("import sys\nwhile True:\n    sys.stdout.write('9' * 65536)\n", add), OL),
        "wrong_answer": (Job(AB + "print(a - b)\n", add), WA),
        "one_test_loops": (Job(loop, three, time_limit_s=0.5), TO),
        "steal_expected": (Job(SCAN, (io("1 2\n", secret),)), WA),
        # the control: a secret in its own input is found, so "none" above means there was none to find
        "scan_control": (Job(SCAN, (io(f"x {secret} y\n", secret),)), P),
        # each test sees its own input only: no other test's input or output, before or after it (the output
        # of an earlier test, or of an earlier program on the slot, would be in the zygote's heap if it
        # passed through it: every child is a fork of the zygote)
        "inputs_isolated": (Job(SCAN + "#2\n", isolated), P),
        "syntax_error": (Job("print(1\n", add), Status.SYNTAX_ERROR),
        # the output cap leaves room for twice a long expected answer (1.5 MB, over the 1 MiB default)
        "long_answer": (Job("import sys\nsys.stdout.write('7\\n' * 750000)\n", (io("", big),)), P),
        "over_twice_the_answer": (
            Job("import sys\nsys.stdout.write('7\\n' * 1600000)\n", (io("", big),)),
            OL,
        ),
    }
    got = run(ex, cases)
    assert [t.status for t in got["one_test_loops"].tests] == [P, TO, P]
    assert got["one_test_loops"].tests[1].error == "wall time limit"
    assert got["syntax_error"].tests == () and "SyntaxError" in got["syntax_error"].detail
    assert got["exit_message"].tests[0].error.endswith("stderr: bye")
    assert got["raise_after_print"].tests[0].error.startswith("ValueError: x | stderr: Traceback")
    assert got["steal_expected"].tests[0].error == "token 1: got 'none', expected 'SECRET-1a2b3c4d'"


# ------------------------------------------------------------------------------------------------------------
# an earlier job's source is nowhere in a later child's memory
# ------------------------------------------------------------------------------------------------------------
# Every child is a fork of its slot's zygote: whatever of an earlier request the zygote ever held in its own
# memory (the program, the setup code, the test calls, the check), a later program could copy out of its own
# address space (another candidate's correct solution). This program collects every "ZYGLEAK" + 32 hex digits
# in all of its readable memory (the regions of /proc/self/maps, read through /proc/self/mem or in place) at
# import; seen(h) says whether one whose sha256 is h was there (the hashes name the earlier jobs' tokens
# without putting them into this program).
MEMSCAN = r"""
import ctypes, hashlib, re
def _scan():
    pat = re.compile(b"ZYG" + b"LEAK([0-9a-f]{32})")
    found = set()
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    try:  # a program whose uid was dropped is not dumpable: /proc/self/mem is root's; read in place then
        mem = open("/proc/self/mem", "rb", buffering=0)
    except OSError:
        mem = None
    for line in maps:
        addr, perms = line.split()[:2]
        if "r" not in perms or "[v" in line:
            continue
        lo, hi = (int(x, 16) for x in addr.split("-"))
        for pos in range(lo, hi, 1 << 24):
            n = min(hi, pos + (1 << 24) + 39) - pos
            try:
                if mem is None:
                    blob = ctypes.string_at(pos, n)
                else:
                    mem.seek(pos)
                    blob = mem.read(n)
            except (OSError, ValueError, OverflowError):
                break
            found.update(hashlib.sha256(m.group(1)).hexdigest() for m in pat.finditer(blob))
    return found
FOUND = _scan()
def seen(h):
    return h in FOUND
"""


def test_no_earlier_job_source_in_a_later_childs_memory():
    kinds = ("program", "call", "setup", "check", "stdio_program", "control")
    tok = {k: secrets.token_hex(16) for k in kinds}
    mark = {k: "ZYGLEAK" + t for k, t in tok.items()}
    earlier = [
        Job(
            f"# {mark['program']}\ndef f(s):\n    return len(s)\n",
            (TC(f"f('{mark['call']}')", 39),),
            setup_code=f"S = '{mark['setup']}'\n",
            child_check=f"assert f('{mark['check']}') == 39\n",
        ),
        Job(f"# {mark['stdio_program']}\nprint(input())\n", (io("1\n", "1\n"),)),
    ]
    # the control: its own token is found, so "not seen" means there was none to find
    scanner = Job(
        MEMSCAN + f"# {mark['control']}\n",
        tuple(TC(f"seen('{hashlib.sha256(tok[k].encode()).hexdigest()}')", k == "control") for k in kinds),
    )
    with Executor(num_workers=1, limits=Limits(wall_s=5.0, cpu_s=5)) as one:  # one slot: the same zygote
        assert [v.status for v in one.run(earlier)] == [P, P]
        (v,) = one.run([scanner])
    assert len(v.tests) == len(kinds), v
    leaked = [k for k, t in zip(kinds, v.tests, strict=True) if not t.passed]
    assert not leaked, f"found in a later child's memory: {leaked} ({v.status}: {v.detail[:200]})"
    assert v.status is P, v


# ------------------------------------------------------------------------------------------------------------
# call-based tests (json_eq)
# ------------------------------------------------------------------------------------------------------------
def test_call_based_json_eq(ex):
    def call(program: str, *tests: tuple[str, object]) -> Job:
        return Job(program, tuple(TC(c, e, kind="json_eq") for c, e in tests))

    pairs = ("pairs([1, 2, 3])", [[1, 2], [2, 3]])
    lying = (
        "\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n        return False\n"
    )
    cases = {
        "tuples_as_lists": (call("def pairs(a):\n    return tuple(zip(a, a[1:]))\n", pairs), P),
        "solution_class": (
            call(
                "class Solution:\n    def twoSum(self, nums, target):\n"
                "        seen = {}\n        for i, x in enumerate(nums):\n"
                "            if target - x in seen:\n                return [seen[target - x], i]\n"
                "            seen[x] = i\n",
                ("Solution().twoSum(*[[2, 7, 11, 15], 9])", [0, 1]),
                ("Solution().twoSum(*[[3, 2, 4], 6])", [1, 2]),
            ),
            P,
        ),
        "float_for_int": (call("def f():\n    return 3.0\n", ("f()", 3)), P),
        "bool_for_int": (call("def f():\n    return True\n", ("f()", 1)), WA),
        "int_for_bool": (call("def f():\n    return 1\n", ("f()", True)), WA),
        "set_for_list": (call("def f():\n    return {1, 2}\n", ("f()", [1, 2])), WA),
        "always_equal_object": (call(f"class E:{lying}def f():\n    return E()\n", ("f()", [1, 2])), WA),
        "lying_int": (
            call(f"class E(int):{lying}    __hash__ = int.__hash__\ndef f():\n    return E(7)\n", ("f()", 3)),
            WA,
        ),
        "lying_str": (
            call(
                f"class S(str):{lying}    __hash__ = str.__hash__\ndef f():\n    return S('no')\n",
                ("f()", "yes"),
            ),
            WA,
        ),
        "lying_list": (
            call(
                f"class L(list):{lying}    def __iter__(self):\n        return iter([1, 2])\n"
                "    def __len__(self):\n        return 2\n"
                "def f():\n    return L([9])\n",
                ("f()", [1, 2]),
            ),
            WA,
        ),
        "str_subclass_right_data": (
            call("class S(str):\n    pass\ndef f():\n    return S('yes')\n", ("f()", "yes")),
            P,
        ),
    }
    run(ex, cases)


# ------------------------------------------------------------------------------------------------------------
# stop_on_failure
# ------------------------------------------------------------------------------------------------------------
def test_stop_on_failure(ex):
    # test 0 is wrong, tests 1 and 2 loop until the time limit: stopping must not run them
    prog = "n = int(input())\nif n == 0:\n    print(-1)\nelse:\n    while True:\n        pass\n"
    tests = (io("0\n", "0\n"), io("1\n", "1\n"), io("2\n", "4\n"))
    ok_tests = (io("1 2\n", "3\n"), io("2 2\n", "4\n"))
    calls = (TC("f(1)", 1, kind="json_eq"), TC("f(2)", 5, kind="json_eq"), TC("f(3)", 3, kind="json_eq"))
    raising = (TC("g(1)", 1, kind="json_eq"), TC("g(2)", 2, kind="json_eq"), TC("g(3)", 3, kind="json_eq"))
    g = "def g(x):\n    if x == 2:\n        raise ValueError('two')\n"
    g += "    while x == 3:\n        pass\n    return x\n"
    cases = {
        "stdio_stop": (Job(prog, tests, time_limit_s=0.5, stop_on_failure=True), WA),
        "stdio_all": (Job(prog + "#all\n", tests, time_limit_s=0.5), TO),
        "stdio_stop_all_pass": (Job(AB + "print(a + b)\n", ok_tests, stop_on_failure=True), P),
        "call_stop": (Job("def f(x):\n    return x\n", calls, stop_on_failure=True), WA),
        "call_all": (Job("def f(x):\n    return x\n#all\n", calls), WA),
        "call_stop_raise": (Job(g, raising, time_limit_s=0.5, stop_on_failure=True), RE),
    }
    t0 = time.monotonic()
    got = run(ex, cases)
    assert time.monotonic() - t0 >= 1.0  # stdio_all ran its two looping tests
    stop, every = got["stdio_stop"], got["stdio_all"]
    assert [t.status for t in stop.tests] == [WA] and stop.detail == "test 0: token 1: got '-1', expected '0'"
    assert stop.seconds < 0.5  # neither looping test ran (each takes the 0.5 s limit)
    assert [t.status for t in every.tests] == [WA, TO, TO] and every.seconds >= 1.0
    assert [t.status for t in got["stdio_stop_all_pass"].tests] == [P, P]
    assert [t.status for t in got["call_stop"].tests] == [P, WA]
    assert [t.status for t in got["call_all"].tests] == [P, WA, P]
    # the child stops at the call that raises: the looping third call never runs
    cr = got["call_stop_raise"]
    assert [t.status for t in cr.tests] == [P, RE] and cr.seconds < 0.5 and "ValueError: two" in cr.detail
    # the flag is part of the cache key: the same program and tests without it is a different job
    again = ex.run([dataclasses.replace(cases["call_stop"][0], stop_on_failure=False)])[0]
    assert not again.cached and len(again.tests) == 3
    assert ex.run([cases["stdio_stop"][0]])[0].cached


# ------------------------------------------------------------------------------------------------------------
# worker death, cache, batch deadline
# ------------------------------------------------------------------------------------------------------------
def test_stdio_worker_death_cache_and_deadline(ex):
    slow = Job(
        "import time\nn = int(input())\ntime.sleep(0.6 if n == 1 else 0)\nprint(n)\n",
        (io("0\n", "0\n"), io("1\n", "1\n"), io("2\n", "2\n")),
    )
    got = {}
    th = threading.Thread(target=lambda: got.update(v=ex.run([slow])))
    th.start()
    time.sleep(0.3)  # inside test 1's sleep: the zygote dies, the test is run again on a new one
    for pid in ex._zygote_pids():
        os.kill(pid, signal.SIGKILL)
    th.join(timeout=30)
    assert not th.is_alive()
    (v,) = got["v"]
    assert v.status is P and v.retried and [t.status for t in v.tests] == [P, P, P], v
    assert ex.run([slow])[0].cached  # a passed stdio verdict is cached like any other
    # the batch deadline caps the first test's wall limit; the second cannot start: a timeout without running
    late = Job("import time\ntime.sleep(0.8)\nprint(1)\n", (io("", "1"), io("", "1")))
    v = ex.run([late], deadline_s=0.5)[0]
    assert v.status is TO and [t.status for t in v.tests] == [TO, TO], v
    assert [t.error for t in v.tests] == ["wall time limit", "not run: batch deadline reached"]
