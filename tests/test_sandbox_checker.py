"""Checker-judged stdin/stdout tests (TestCase.checker) and file-I/O tests (TestCase.input_file /
output_file), the two things open-r1/codeforces needs, through the real executor.

One executor for the module (the sandbox of a TINY run: 2 slots, 2 s wall); each group of programs is one
batch. The reference is open-r1's runner (guipenedo/piston packages/codeforces/1.0.0/run): `python3
checker.py <input> correct_output.txt <solution output>` after the candidate ran, accepted iff its stdout
without whitespace is "1" or "100"; file mode reads input.txt and judges output.txt. docs/SANDBOX.md §3.7.
"""

from __future__ import annotations

import dataclasses

import mainjob
import pytest

from grpo_jax.sandbox import grading
from grpo_jax.sandbox.types import Job, Status
from grpo_jax.sandbox.types import TestCase as TC

P, WA, RE, TO = Status.PASSED, Status.WRONG_ANSWER, Status.RUNTIME_ERROR, Status.TIMEOUT

# "print any two integers summing to n": the checker reads n from the input file (argv[1]) and the answer
# from the solution's output file (argv[3]); the correct output (argv[2]) is one answer among many.
SUM_CHECKER = """
import sys
n = int(open(sys.argv[1]).read().split()[0])
toks = open(sys.argv[3]).read().split()
ok = len(toks) == 2 and all(t.lstrip("-").isdigit() for t in toks) and int(toks[0]) + int(toks[1]) == n
print(1 if ok else 0)
"""
TWO_SUM = "n = int(input())\nprint(1, n - 1)\n"  # a right answer that is not the correct output ("5 5")
FILES = {"input_file": "input.txt", "output_file": "output.txt"}


def sum_test(n: int, checker: str = SUM_CHECKER, **kw) -> TC:
    return TC(
        call="", kind="stdout", stdin=f"{n}\n", expected=f"{n // 2} {n - n // 2}\n", checker=checker, **kw
    )


# the stdin/stdout tests' helpers: io(...) a test, run(ex, {name: (job, status)}) checks every status
from test_sandbox_stdio import io, run  # noqa: E402


@pytest.fixture(scope="module")
def ex():
    with mainjob.executor() as e:
        yield e


def error(v) -> str:
    (t,) = v.tests
    return t.error


# ------------------------------------------------------------------------------------------------------------
# The texts a checker is given, in the parent (no processes)
# ------------------------------------------------------------------------------------------------------------
def test_checker_texts_as_open_r1_prepares_them():
    d = grading.drop_blank_lines  # sed '/^$/d'
    assert d(b"") == b"" and d(b"\n\n") == b"" and d(b"1\n\n2\n\n") == b"1\n2\n"
    assert d(b"\n1 9") == b"1 9" and d(b" \n1\n") == b" \n1\n"  # no final newline stays; a space line stays
    c = grading.checker_correct_output  # $(cat), echo, sed 's/\r$//', sed '/^$/d'
    assert c("5 5") == b"5 5\n" and c("5 5\n\n\n") == b"5 5\n" and c("a\r\n\r\nb\r\n") == b"a\nb\n"
    assert c("") == b"" and c(b"x\n") == b"x\n"


def test_validation():
    ok = TC(call="", kind="stdout", stdin="", expected="1", checker="print(1)", **FILES)
    assert (ok.checker, ok.input_file, ok.output_file) == ("print(1)", "input.txt", "output.txt")
    with pytest.raises(ValueError, match=r"checker=int \(must be Python source"):
        io("", "1", checker=1)
    with pytest.raises(ValueError, match=r"checker=<blank>"):
        io("", "1", checker="  \n")
    for name in ("../input.txt", "/tmp/input.txt", "a/b", "..", ".", "x\0y", "é" * 128):
        with pytest.raises(ValueError, match=r"input_file=.* \((must be a plain file name|longer than 255)"):
            io("", "1", input_file=name)
        with pytest.raises(ValueError, match=r"output_file=.* \((must be a plain file name|longer than 255)"):
            io("", "1", output_file=name)
    with pytest.raises(ValueError, match=r"output_file=None \(must be a str"):
        io("", "1", output_file=None)
    with pytest.raises(ValueError, match=r"input_file = output_file = 'io.txt' \(must differ\)"):
        io("", "1", input_file="io.txt", output_file="io.txt")
    with pytest.raises(
        ValueError, match=r"checker / output_file is only for kind='stdout' tests, not kind='eq'"
    ):
        TC(call="f()", expected=1, checker="print(1)", output_file="output.txt")


# ------------------------------------------------------------------------------------------------------------
# Checker-judged tests
# ------------------------------------------------------------------------------------------------------------
def test_checker_verdicts(ex):
    accept_all = "print(1)\n"
    tests = (sum_test(10), sum_test(7), sum_test(-4))
    # the checker is given the input, the correct output and the answer, the two outputs without empty lines
    sees = (
        "import sys\n"
        "texts = [open(p).read() for p in sys.argv[1:]]\n"
        "print(1 if sys.argv[0] == 'checker.py' and texts == ['10\\n', '5 5\\n', ' 1 9\\n'] else 0)\n"
    )
    cases = {
        "another_right_answer": (Job(TWO_SUM, tests), P),
        "wrong_sum": (Job("n = int(input())\nprint(1, n)\n", tests), WA),
        "not_two_numbers": (Job("n = int(input())\nprint(n)\n", tests), WA),
        # a crash, a non-zero exit, a time limit stay the candidate's status: a checker is not consulted
        "crash": (Job("n = int(input())\nprint(1, n - 1)\nraise ValueError('late')\n", tests), RE),
        "crash_accept_all": (Job("n = int(input())\n1 / 0\n", (sum_test(10, accept_all),)), RE),
        "exit_1_accept_all": (Job("import sys\nsys.exit(1)\n", (sum_test(10, accept_all),)), RE),
        "loop_accept_all": (
            Job("while True:\n    pass\n", (sum_test(10, accept_all),), time_limit_s=0.5),
            TO,
        ),
        "checker_raises": (Job(TWO_SUM, (sum_test(10, "raise ValueError('broken checker')\n"),)), WA),
        "checker_syntax_error": (Job(TWO_SUM, (sum_test(10, "print(1\n"),)), WA),
        "checker_exit_3": (Job(TWO_SUM, (sum_test(10, "import sys\nprint(1)\nsys.exit(3)\n"),)), WA),
        "checker_100": (Job(TWO_SUM, (sum_test(10, "print(100)\n"),)), P),
        "checker_spaced_1": (Job(TWO_SUM, (sum_test(10, "print(' 1 ')\nprint()\n"),)), P),
        "checker_0": (Job(TWO_SUM, (sum_test(10, "print(0)\n"),)), WA),
        "checker_11": (Job(TWO_SUM, (sum_test(10, "print(11)\n"),)), WA),
        "checker_1_0": (Job(TWO_SUM, (sum_test(10, "print('1 0')\n"),)), WA),
        "checker_silent": (Job(TWO_SUM, (sum_test(10, "pass\n"),)), WA),
        "checker_sees": (Job("print()\nprint(' 1 9')\nprint()\n", (sum_test(10, sees),)), P),
    }
    before = ex.stats()["checker_runs"]
    got = run(ex, cases)
    # one checker run per test whose candidate run ended normally (3 + 3 + 3 for the three-test jobs, 1 for
    # each checker_*); none for crash, crash_accept_all, exit_1_accept_all, loop_accept_all
    assert [t.status for t in got["crash"].tests] == [RE, RE, RE]
    assert ex.stats()["checker_runs"] - before == 9 + 10
    assert [t.status for t in got["another_right_answer"].tests] == [P, P, P]
    assert [t.status for t in got["wrong_sum"].tests] == [WA, WA, WA]
    assert error(got["checker_0"]) == "checker: not accepted (it printed '0')"
    assert got["wrong_sum"].tests[0].got == "1 10\n"  # the candidate's answer, for execution feedback
    assert error(got["checker_raises"]).startswith("checker failed: ValueError: broken checker")
    assert error(got["checker_syntax_error"]).startswith("checker failed: SyntaxError")
    assert error(got["checker_exit_3"]) == "checker failed: exit status 3"
    assert error(got["crash_accept_all"]).startswith("ZeroDivisionError")


def test_checker_time_limit_and_deadline(ex, monkeypatch):
    # a checker that does not finish fails the test (wrong_answer), after its own limit (10 s in open-r1's
    # runner; 1 s here to keep the test short: the executor reads grading.CHECKER_WALL_S at each run)
    monkeypatch.setattr(grading, "CHECKER_WALL_S", 1.0)
    v = run(ex, {"loops": (Job(TWO_SUM, (sum_test(10, "while True:\n    pass\n"),)), WA)})["loops"]
    assert error(v) == "checker failed: time limit (1 s)"
    # a checker cut short by the batch deadline is the deadline's timeout, not the candidate's wrong answer
    slow = Job(TWO_SUM + "#deadline\n", (sum_test(10, "import time\ntime.sleep(5)\nprint(1)\n"),))
    (v,) = ex.run([slow], deadline_s=0.8)
    assert v.status is TO and error(v) == "checker stopped: batch deadline reached", v
    assert not ex.run([slow])[0].cached  # a timeout is never cached


def test_candidate_cannot_see_the_correct_output(ex):
    secret = "SECRET-5e3c2a1b"
    copy_checker = "import sys\nprint(1 if open(sys.argv[3]).read() == open(sys.argv[2]).read() else 0)\n"
    # Looks for SECRET-xxxxxxxx in everything a candidate could copy from: argv and the paths a checker gets,
    # every file under its work dir and /tmp, its stdin and other fds, /proc of every process it can see;
    # prints the first one found ("none" else).
    steal = r"""
import os, re, sys
pat = re.compile(rb"SEC" + rb"RET-[0-9a-f]{8}")
found = []
def look(b):
    if isinstance(b, str):
        b = b.encode()
    found.extend(m.group().decode() for m in pat.finditer(b))
def read(p):
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        try:
            look(os.read(fd, 1 << 20))
        finally:
            os.close(fd)
    except OSError:
        pass
look(repr(sys.argv))
for p in sys.argv[1:] + ["input.txt", "correct_output.txt", "solution_output.txt", "checker.py",
                         "/tmp/correct_output.txt", "../correct_output.txt"]:
    read(p)
for top in {os.getcwd(), "/tmp"}:
    for root, dirs, files in os.walk(top):
        for f in files:
            read(os.path.join(root, f))
for fd in range(0, 64):
    try:
        look(os.pread(fd, 1 << 20, 0))
    except OSError:
        pass
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for part in ("cmdline", "environ"):
            read(f"/proc/{pid}/{part}")
answer = found[0] if found else "none"
print(answer)
open("output.txt", "w").write(answer + "\n")  # the answer of a file-I/O test
"""
    # a daemon that outlives the candidate to swap its answer for the correct output in the checker's run
    daemon = r"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # busy: the checker reads its files within milliseconds of their creation
        os.closerange(0, 256)  # the candidate's pipes close: its run ends normally, the checker runs
        end = time.time() + 3
        while time.time() < end:
            try:
                if os.path.getsize("/tmp/solution_output.txt"):
                    answer = open("/tmp/correct_output.txt").read()
                    if answer:
                        open("/tmp/solution_output.txt", "w").write(answer)
            except OSError:
                pass
    os._exit(0)
print("none")
"""

    def t(stdin: str, checker: str = copy_checker, **kw) -> TC:
        return io(stdin, secret + "\n", checker=checker, **kw)

    # a checker that takes its time before it reads the files: a surviving daemon would have all of it
    slow_checker = "import time\ntime.sleep(0.3)\n" + copy_checker

    cases = {
        "steal": (Job(steal, (t("1\n"),)), WA),
        "steal_file_mode": (Job(steal, (t("1\n", **FILES),)), WA),
        "daemon": (Job(daemon, (t("1\n", slow_checker),)), WA),
        # the controls: a secret where the candidate may look (its own input: stdin, input.txt) is found and
        # copied, so "none" above means there was none to find
        "control_stdin": (Job(steal + "#stdin\n", (t(f"x {secret} y\n"),)), P),
        "control_input_file": (Job(steal + "#file\n", (t(f"x {secret} y\n", **FILES),)), P),
    }
    if ex.tier.startswith(("seccomp+rlimits", "rlimits")):
        del cases["daemon"]  # no pid namespace: a setsid daemon escapes the tree kill (docs/SANDBOX.md §2)
    got = run(ex, cases)
    assert got["steal"].tests[0].got == "none\n" and got["steal_file_mode"].tests[0].got == "none\n"


# ------------------------------------------------------------------------------------------------------------
# File-I/O tests
# ------------------------------------------------------------------------------------------------------------
def test_file_io(ex):
    square = (
        "n = int(open('input.txt').read())\nwith open('output.txt', 'w') as f:\n    f.write(f'{n * n}\\n')\n"
    )
    tests = (io("3\n", "9\n", **FILES), io("12\n", "144\n", **FILES))
    cases = {
        "reads_and_writes_files": (Job(square, tests), P),
        "stdout_only": (Job("print(int(open('input.txt').read()) ** 2)\n", tests), WA),
        # stdin is empty in file mode: input() hits EOF
        "reads_stdin": (Job("n = int(input())\nopen('output.txt', 'w').write(str(n * n))\n", tests), RE),
        # the file decides; the stdout is ignored
        "wrong_file_right_stdout": (
            Job(
                "n = int(open('input.txt').read())\nprint(n * n)\nopen('output.txt', 'w').write('0')\n", tests
            ),
            WA,
        ),
        "symlink_output": (Job("import os\nos.symlink('/etc/hostname', 'output.txt')\n", tests), WA),
        "fifo_output": (Job("import os\nos.mkfifo('output.txt')\n", tests), WA),
        "dir_output": (Job("import os\nos.mkdir('output.txt')\n", tests), WA),
        "crash_after_writing": (Job(square + "raise SystemExit(2)\n", tests), RE),
        # input from stdin, answer in a file; input from a file, answer on stdout
        "output_file_only": (
            Job(
                "open('out.txt', 'w').write(str(int(input()) + 1))\n",
                (io("4\n", "5\n", output_file="out.txt"),),
            ),
            P,
        ),
        "input_file_only": (
            Job("print(open('in.txt').read().upper())\n", (io("ab\n", "AB\n", input_file="in.txt"),)),
            P,
        ),
        "checker_file_mode": (
            Job(
                "n = int(open('input.txt').read())\nopen('output.txt', 'w').write(f'{n + 3}\\n\\n-3\\n')\n",
                (sum_test(10, **FILES), sum_test(7, **FILES)),
            ),
            P,
        ),
        "checker_file_mode_wrong": (
            Job(
                "n = int(open('input.txt').read())\nopen('output.txt', 'w').write(f'{n} 1')\n",
                (sum_test(10, **FILES),),
            ),
            WA,
        ),
        "checker_file_mode_missing": (
            Job(TWO_SUM.replace("input()", "open('input.txt').read()"), (sum_test(10, **FILES),)),
            WA,
        ),
    }
    got = run(ex, cases)
    missing = "no output file 'output.txt' (missing): this test judges the file the program writes, not its "
    assert got["stdout_only"].tests[0].error == missing + "standard output"
    assert got["checker_file_mode_missing"].tests[0].error == missing + "standard output"
    assert got["symlink_output"].tests[0].error.startswith("no output file 'output.txt' (a symbolic link)")
    assert got["fifo_output"].tests[0].error.startswith("no output file 'output.txt' (not a regular file)")
    assert got["dir_output"].tests[0].error.startswith("no output file 'output.txt' (not a regular file)")
    assert got["wrong_file_right_stdout"].tests[0].got == "0"


def test_cache_keys_on_checker_and_files(ex):
    base = Job(TWO_SUM + "#cache\n", (sum_test(10, "print(1)\n"),))
    assert ex.run([base])[0].status is P and ex.run([base])[0].cached
    rejecting = dataclasses.replace(base, tests=(sum_test(10, "print(0)\n"),))
    v = ex.run([rejecting])[0]
    assert v.status is WA and not v.cached
    file_mode = dataclasses.replace(base, tests=(sum_test(10, "print(1)\n", output_file="output.txt"),))
    v = ex.run([file_mode])[0]
    assert v.status is WA and not v.cached and "no output file" in v.detail
