"""The code-reward executor: a pool of pre-forked sandbox zygotes and a batch API that never raises.

    with Executor(num_workers=None, limits=Limits(), tier="auto") as ex:
        print(ex.tier)                       # what the probe child actually observed
        verdicts = ex.run(jobs, deadline_s=60)

Each slot is a zygote process started with ``subprocess.Popen`` of ``/usr/bin/python3 -I -S -c <source>``
(fork+exec; this process is never forked without exec, so it is safe to use from a JAX trainer). The zygote
forks one sandboxed child per program (see `_zygote.py` and `isolation.py`). The parent (this module) sends
only the program and the test *calls*; the expected values never leave this process and the verdict is decided
here from plain data (`grading.py`). A stdin/stdout job (tests of kind "stdout") is one request per test:
the program and that test's input go to the zygote, its standard output (or a file-I/O test's output file)
comes back and is compared here; a checker-judged test's output then goes, with the correct output, to the
test's checker, run as a separate sandboxed program (`CHECKER_RUNNER`), whose verdict is read here.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
import select
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from grpo_jax.sandbox import cgroups, grading, isolation
from grpo_jax.sandbox.types import Job, Limits, Status, TestResult, Verdict, is_stdio

_HELLO_TIMEOUT_S = 30.0
_RESPONSE_SLACK_S = 10.0  # a zygote that does not answer within wall + this is declared dead
MAX_RESPONSE_BYTES = 64 << 20


class _WorkerDied(Exception):
    pass


# what the zygote reads of a request (with the sizes of what follows); everything else (the program, setup
# code, test calls, the stop flag) is the payload, which only the child parses
_HEADER_KEYS = ("op", "id", "limits", "stdio", "input_file", "output_file")


class _JobOver(Exception):
    """A stdin/stdout job ends now with this verdict (its worker died twice, or could not be restarted)."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.detail)
        self.verdict = verdict


class _Slot:
    """One zygote process. Used by one thread at a time."""

    def __init__(self, index: int, mode: str, seccomp: bool, uid: int | None, python: str, source: str):
        self.index = index
        self.cfg = {"mode": mode, "seccomp": seccomp, "uid": uid, "slot": index}
        self.python = python
        self.source = source
        self.proc: subprocess.Popen | None = None
        self.hello: dict = {}
        self._next_id = 0

    def start(self) -> dict:
        self.kill()
        self.proc = subprocess.Popen(
            [self.python, "-I", "-S", "-c", self.source, json.dumps(self.cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={},
            cwd="/",
            close_fds=True,
        )
        try:
            self.hello = json.loads(self._read_frame(_HELLO_TIMEOUT_S, 1)[0])
        except (_WorkerDied, ValueError) as e:
            self.kill()
            raise _WorkerDied(f"zygote {self.index} did not start: {e}") from None
        if not self.hello.get("ok"):
            self.kill()
        return self.hello

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        for f in (p.stdin, p.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            p.kill()
        except OSError:
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        p = self.proc
        if p is not None and self.alive():
            try:
                self._write({"op": "quit"})
                p.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired, _WorkerDied):
                pass
        self.kill()

    def _write(self, obj: dict, *blobs: bytes) -> None:
        """One request: the length-prefixed JSON header `obj`, then the raw blobs (their sizes are in it)."""
        if not self.alive():
            raise _WorkerDied("zygote not running")
        assert self.proc is not None and self.proc.stdin is not None  # alive(); started with stdin=PIPE
        stdin = self.proc.stdin
        body = json.dumps(obj, ensure_ascii=True).encode()
        try:
            stdin.write(struct.pack("!I", len(body)) + body)
            for blob in blobs:
                if blob:
                    stdin.write(blob)
            stdin.flush()
        except (OSError, ValueError) as e:
            raise _WorkerDied(f"write to zygote failed: {e}") from None

    def _send_request(self, req: dict, check: bytes = b"", stdin: bytes = b"") -> None:
        """A request to the zygote: a header it parses (id, limits, flags, sizes), then the job's text as raw
        bytes it never parses: the payload (program, setup code, test calls: JSON, read by the child after
        the fork), the check text and a stdio test's input (each spliced into a memfd, so that nothing of a
        job is ever in the zygote's memory, of which every later child is a copy)."""
        header = {k: req[k] for k in _HEADER_KEYS if k in req}
        payload = json.dumps(
            {k: v for k, v in req.items() if k not in _HEADER_KEYS}, ensure_ascii=True
        ).encode()
        header.update(payload_len=len(payload), check_len=len(check), stdin_len=len(stdin))
        self._write(header, payload, check, stdin)

    def _read_frame(self, timeout: float, nparts: int) -> list[bytes]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = bytearray()

        def need(n: int) -> bytes:
            while len(buf) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _WorkerDied("zygote did not answer in time")
                r, _, _ = select.select([fd], [], [], left)
                if not r:
                    continue
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise _WorkerDied("zygote exited")
                buf.extend(chunk)
            out = bytes(buf[:n])
            del buf[:n]
            return out

        parts = []
        for _ in range(nparts):
            (n,) = struct.unpack("!I", need(4))
            if n > MAX_RESPONSE_BYTES:
                raise _WorkerDied("oversized frame from zygote")
            parts.append(need(n))
        if buf:
            raise _WorkerDied("unexpected bytes from zygote")
        return parts

    def execute(self, req: dict, timeout: float, check: bytes = b"") -> tuple[dict, bytes, bytes]:
        """Run one request. The program, setup and calls (the payload) and `check` (the child check's text)
        travel after the header, as raw bytes the zygote never parses (see `_send_request`)."""
        self._next_id += 1
        self._send_request(dict(req, id=self._next_id), check=check)
        hdr, res, out = self._read_frame(timeout, 3)
        info = json.loads(hdr)
        if info.get("id") != self._next_id:
            raise _WorkerDied("response out of order")
        return info, res, out

    def execute_stdio(self, req: dict, timeout: float, stdin: bytes) -> tuple[dict, bytes, bytes, bytes]:
        """Run one stdin/stdout test: the program (the payload) and the input travel after the header (the
        zygote splices each into a sealed memfd, never into its own memory); (info, records, stderr excerpt,
        the whole stdout) back."""
        self._next_id += 1
        self._send_request(dict(req, id=self._next_id, stdio=True), stdin=stdin)
        hdr, res, out, stdout = self._read_frame(timeout, 4)
        info = json.loads(hdr)
        if info.get("id") != self._next_id:
            raise _WorkerDied("response out of order")
        return info, res, out, stdout


MAX_CHECK_BYTES = 1 << 20  # the zygote's bound on a check (_zygote.MAX_CHECK)


def _check_bytes(job: Job) -> bytes:
    return job.child_check.encode("utf-8", "surrogateescape") if job.child_check is not None else b""


def _limits_dict(lim: Limits) -> dict:
    d = dataclasses.asdict(lim)
    d["workdir_inodes"] = 4096
    return d


def _stdin_bytes(t: grading.TestCase) -> bytes:
    s = t.stdin if t.stdin is not None else ""
    return s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")


# A stdin/stdout test's output cap (stdout + stderr) is the job's Limits.output_bytes, or room for twice its
# expected output plus 64 KiB when that is larger (a contest answer of several MB must not end as
# output_limit), at most STDIO_OUTPUT_MAX. The expected text is the dataset's (trusted), never the program's.
STDIO_OUTPUT_MAX = 64 << 20


def _stdio_output_cap(lim: Limits, t: grading.TestCase) -> int:
    e = t.expected
    n = len(e) if isinstance(e, bytes) else len(str(e).encode("utf-8", "surrogateescape"))
    return max(lim.output_bytes, min(STDIO_OUTPUT_MAX, 2 * n + (64 << 10)))


def _expected_key(t: grading.TestCase):
    if t.kind == "stdout":  # the texts, hashed (they may be megabytes); the checker and the files judge too
        e = (
            t.expected
            if isinstance(t.expected, bytes)
            else str(t.expected).encode("utf-8", "surrogateescape")
        )
        checker = (
            hashlib.sha256(t.checker.encode("utf-8", "surrogateescape")).hexdigest() if t.checker else ""
        )
        return [
            "stdout",
            hashlib.sha256(e).hexdigest(),
            hashlib.sha256(_stdin_bytes(t)).hexdigest(),
            checker,
            t.input_file,
            t.output_file,
        ]
    return grading.tag(t.expected)


# The runner of a checker-judged test's checker (TestCase.checker): a fixed program that the zygote runs as a
# stdin/stdout program of its own, in a fresh sandboxed child after the candidate's tree is gone (never in the
# candidate's process, never in this one), with the executor's limits but CHECKER_WALL_S of wall and CPU time.
# Its stdin (a sealed memfd, `_checker_stdin`) is one ASCII line with four sizes, then the checker's source,
# the test's input, the correct output and the solution's output. It copies the last three, in the kernel
# (sendfile), into files of its own work dir (a fresh /tmp), empties its stdin, and runs the checker as
# `__main__` the way open-r1's runner does: `python3 checker.py input.txt correct_output.txt
# solution_output.txt`. How it ends (exit status, exception, stdout) is the zygote's report, judged in the
# parent by grading.grade_checker. The candidate never sees these files: they exist only in the checker's
# run, after the candidate's; its argv is ["solution.py"].
CHECKER_RUNNER = r"""
import builtins, os, sys, types


def _read_at(fd, n, off):
    chunks = []
    while n > 0:
        b = os.pread(fd, min(n, 1 << 24), off)
        if not b:
            raise EOFError("the checker's request is shorter than announced")
        chunks.append(b)
        n, off = n - len(b), off + len(b)
    return b"".join(chunks)


def _unpack(names):
    head = os.pread(0, 256, 0)
    line = head[: head.index(b"\n") + 1]
    sizes = [int(x) for x in line.split()]
    off = len(line)
    source = _read_at(0, sizes[0], off)
    off += sizes[0]
    for name, n in zip(names, sizes[1:]):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        end = off + n
        while off < end:
            k = os.sendfile(fd, 0, off, end - off)
            if k <= 0:
                raise EOFError("the checker's request is shorter than announced")
            off += k
        os.close(fd)
    return source.decode("utf-8", "surrogateescape")


_names = ("input.txt", "correct_output.txt", "solution_output.txt")
_source = _unpack(_names)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="surrogateescape", newline="\n", closefd=False)
_main = types.ModuleType("__main__")
_main.__dict__["__builtins__"] = builtins
sys.modules["__main__"] = _main
sys.argv = ["checker.py", *_names]
_code = compile(_source, "checker.py", "exec")
del _source
exec(_code, _main.__dict__)
"""


def _checker_stdin(tc: grading.TestCase, answer: bytes) -> tuple[bytes, int]:
    """CHECKER_RUNNER's stdin for test `tc` and the candidate's `answer` (its stdout or output file), and the
    largest of the three files it writes. The texts are prepared as open-r1's runner prepares them: the
    input as the candidate got it, the correct output and the answer without their empty lines."""
    parts = [
        tc.checker.encode("utf-8", "surrogateescape"),
        _stdin_bytes(tc),
        grading.checker_correct_output(tc.expected),
        grading.drop_blank_lines(answer),
    ]
    head = (" ".join(str(len(p)) for p in parts) + "\n").encode("ascii")
    return head + b"".join(parts), max(len(p) for p in parts[1:])


def _job_key(job: Job, lim: Limits) -> str:
    payload = json.dumps(
        [
            job.program,
            job.setup_code,
            job.child_check,
            [[t.call, _expected_key(t), t.float_tol, t.kind, repr(t.wrap)] for t in job.tests],
            dataclasses.asdict(lim),
            job.stop_on_failure,
        ],
        ensure_ascii=True,
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


class Executor:
    """A batch executor over `num_workers` slots; `run` never raises: one verdict per job, in order."""

    def __init__(
        self,
        num_workers: int | None = None,
        limits: Limits | None = None,
        tier: str = "auto",
        cache_size: int = 100_000,
    ):
        self.limits = limits or Limits()
        self.num_workers = int(num_workers) if num_workers else max(2, os.cpu_count() or 2)
        if self.num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.cache_size = int(cache_size)
        self._cache: collections.OrderedDict[str, Verdict] = collections.OrderedDict()
        self._expected: dict[tuple[str, str], tuple[bool, object]] = {}  # (prelude, expr) -> oracle answer
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()
        self._busy_s = 0.0
        self._closed = False
        self._uids = isolation.UidLease()
        self._slots: list[_Slot] = []
        python = isolation.sandbox_python()
        if not python:
            raise RuntimeError(f"sandbox interpreter {isolation.SANDBOX_PYTHON} is missing")
        source = isolation.zygote_source()
        errors: dict = {}
        self._report: dict = {}
        self._cg = cgroups.SlotCgroups()
        self._cg.setup(self.num_workers, self.limits.memory_bytes, self.limits.processes)
        self._cg_memory = [self.limits.memory_bytes] * self.num_workers
        for mode in isolation.candidate_modes(tier):
            try:
                self._start_mode(mode, python, source, errors)
                break
            except Exception as e:  # degrade honestly to the next tier
                errors[mode] = f"{type(e).__name__}: {e}"
                self._stop_slots()
        else:
            raise RuntimeError(f"no sandbox tier could be started: {errors}")
        self.tier = self._report["tier"]

    # -------------------------------------------------------------------------------------------- lifecycle
    def _start_mode(self, mode: str, python: str, source: str, errors: dict) -> None:
        seccomp = True
        slots = []
        for i in range(self.num_workers):
            uid = self._uids.acquire() if mode == "root" else None
            slot = _Slot(i, mode, seccomp, uid, python, source)
            slot.cfg["cgroup_procs"] = self._cg.procs_files(i)
            slots.append(slot)
            self._slots = slots
            hello = slot.start()
            if not hello.get("ok"):
                raise RuntimeError(f"zygote refused mode {mode}: {hello.get('errors')}")
            if hello.get("errors"):
                errors.setdefault(mode, {}).update(hello["errors"])
            if slot.cfg["cgroup_procs"] and not hello.get("cgroup"):
                self._cg.report.update(
                    active=False, why=f"a zygote could not join: {hello['errors'].get('cgroup')}"
                )
            if not hello.get("seccomp"):
                seccomp = False
                for s in slots:
                    s.cfg["seccomp"] = False
        # probe: observe the protections from inside a real sandboxed child
        probe = Job(
            program=isolation.PROBE_PROGRAM,
            tests=(grading.TestCase(call="_facts()", expected=None),),
        )
        info, raw, _ = slots[0].execute(
            self._request(probe, self.limits), self.limits.wall_s + _RESPONSE_SLACK_S
        )
        records, _ = grading.parse_records(raw, 1 << 20)
        facts = None
        for r in records:
            if r.get("k") == "t" and r.get("i") == 0 and "v" in r:
                facts = grading.untag(r["v"])
        if not isinstance(facts, dict):
            raise RuntimeError(f"probe child gave no facts: {info} {raw[:300]!r}")
        report = isolation.report_from_probe(mode, seccomp, facts, errors, cgroup=self._cg.report)
        a = report["active"]
        needed = {
            "root": (
                "pid_namespace",
                "mount_namespace_minimal_root",
                "network_namespace",
                "no_loopback",
                "unprivileged_uid_per_slot",
                "cleared_env",
            ),
            "userns": (
                "pid_namespace",
                "mount_namespace_minimal_root",
                "network_namespace",
                "no_loopback",
                "non_root",
                "cleared_env",
            ),
            "rlimits": ("cleared_env",),
        }[mode]
        lacking = [k for k in needed if not a[k]]
        if lacking:
            raise RuntimeError(f"probe did not observe {lacking} in mode {mode}")
        self._report = report

    def _stop_slots(self) -> None:
        for s in self._slots:
            s.close()
        self._slots = []
        self._uids.release_all()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._run_lock:
            self._stop_slots()
            self._cg.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -------------------------------------------------------------------------------------------- reporting
    @property
    def uids(self) -> tuple[int, ...]:
        """The per-slot sandbox uids this executor holds (root mode; empty otherwise)."""
        return self._uids.uids

    def tier_report(self) -> dict:
        r = dict(self._report)
        r["num_workers"] = self.num_workers
        r["interpreter"] = isolation.SANDBOX_PYTHON
        r["seccomp_denied_syscalls"] = (
            sorted(set(self._slots[0].hello.get("denied", []))) if self._slots else []
        )
        r["cgroup"] = dict(self._cg.report)
        return r

    def tier_line(self) -> str:
        """One line for logs: the tier, the slots, and the cgroup limits in force (or why there are none)."""
        cg = self._cg.report
        if cg.get("active"):
            limits = (
                f"cgroup {cg['version']}: memory {cg['memory_bytes'] >> 20} MiB, pids {cg['pids']} per slot"
            )
            if cg.get("v2_unavailable"):
                limits += f" (v2 unusable: {cg['v2_unavailable']})"
        else:
            limits = (
                f"no cgroup limits ({cg.get('why') or 'not set up'}); RLIMIT_AS / RLIMIT_NPROC per program"
            )
        return f"{self.tier} ({self.num_workers} slots); {limits}"

    def stats(self) -> dict:
        with self._lock:
            c = dict(self._counts)
            busy = self._busy_s
        executed = c.get("executed", 0)
        out = {
            "programs": c.get("programs", 0),
            "executed": executed,
            "cache_hits": c.get("cache_hits", 0),
            "restarts": c.get("restarts", 0),
            "retries": c.get("retries", 0),
            "infra_errors": c.get("status:infra_error", 0),
            "deadline_skipped": c.get("deadline_skipped", 0),
            "oracle_runs": c.get("oracle_runs", 0),
            "stdio_test_runs": c.get("stdio_test_runs", 0),  # sandboxed runs of stdin/stdout tests
            "checker_runs": c.get("checker_runs", 0),  # sandboxed runs of checkers (TestCase.checker)
            "cgroup_oom_kills": c.get(
                "cgroup_oom_kills", 0
            ),  # children that computed non-literal expected values
            "leftover_processes_killed": c.get("leftover", 0),
            "busy_seconds": busy,
            "programs_per_s": (executed / busy) if busy > 0 else 0.0,
        }
        for s in Status:
            out[s.value] = c.get("status:" + s.value, 0)
        return out

    # -------------------------------------------------------------------------------------------- running
    def _request(self, job: Job, lim: Limits, wall: float | None = None, output: int | None = None) -> dict:
        ld = _limits_dict(lim)
        if wall is not None:
            ld["wall_s"] = wall
        if output is not None:  # a stdin/stdout test's own output cap (_stdio_output_cap)
            ld["output_bytes"] = output
        return {
            "op": "run",
            "program": job.program,
            "setup": job.setup_code or "",
            "calls": [t.call for t in job.tests if t.kind != "stdout"],
            "limits": ld,
            "stop": bool(getattr(job, "stop_on_failure", False)),
        }

    def run(self, jobs: Sequence[Job], deadline_s: float | None = None) -> list[Verdict]:
        """Exactly one Verdict per job, in order. Never raises (an internal failure gives infra_error)."""
        try:
            jobs = list(jobs)
        except Exception:
            return []  # not a sequence: nothing to answer
        try:
            with self._run_lock:
                return self._run(self._resolve_expected(jobs), deadline_s)
        except Exception as e:  # defensive: the contract is "never raises"
            v = Verdict(Status.INFRA_ERROR, False, detail=f"executor: {type(e).__name__}: {e}"[:300])
            with self._lock:
                self._counts["status:infra_error"] += len(jobs)
            return [v] * len(jobs)

    # ------------------------------------------------------------------------------- expected-value oracle
    def _resolve_expected(self, jobs: list) -> list:
        """Fill in `expected` of the tests whose expected side is an expression (`TestCase.expected_expr`).

        Each distinct (prelude, expression) is evaluated once per executor, in a sandboxed child whose program
        is the prelude's import lines only: no candidate ever runs there, and the value comes back as tagged
        plain data like any result. An expression that raises, times out or gives a value that is not plain
        data makes its test `kind="invalid"` (it fails, with the reason in the test's error)."""
        todo: dict[str, set[str]] = {}
        for job in jobs:
            for t in getattr(job, "tests", ()) or ():
                if isinstance(t, grading.TestCase) and t.expected_expr is not None:
                    if (t.prelude, t.expected_expr) not in self._expected:
                        todo.setdefault(t.prelude, set()).add(t.expected_expr)
        for prelude, exprs in todo.items():
            ordered = sorted(exprs)
            got = self._evaluate(prelude, ordered)
            for e in [e for e in ordered if e not in got]:  # one slow or crashing expression: one at a time
                got.update(self._evaluate(prelude, [e]))
            for e in ordered:
                if e in got:
                    self._expected[(prelude, e)] = got[e]
        out = []
        for job in jobs:
            if isinstance(job, Job) and any(t.expected_expr is not None for t in job.tests):
                job = dataclasses.replace(job, tests=tuple(self._resolved(t) for t in job.tests))
            out.append(job)
        return out

    def _resolved(self, t: grading.TestCase) -> grading.TestCase:
        if t.expected_expr is None:
            return t
        hit = self._expected.get((t.prelude, t.expected_expr))
        if hit is None:  # the oracle child could not run (infra): leave it for _prepare to report
            return t
        ok, value = hit
        if ok:
            return dataclasses.replace(t, expected=value, expected_expr=None)
        return dataclasses.replace(t, kind="invalid", expected=value, expected_expr=None)

    def evaluate(self, prelude: str, exprs: Sequence[str], slot: int = 0) -> dict[str, tuple[bool, object]]:
        """Public `_evaluate`: run `prelude` in a sandboxed child on zygote `slot` (mod the slot count) and
        evaluate each expression there; plain values back. Not concurrently with `run` nor twice on a slot."""
        return self._evaluate(prelude, list(exprs), slot)

    def _evaluate(self, prelude: str, exprs: list[str], at: int = 0) -> dict[str, tuple[bool, object]]:
        """{expr: (True, value) | (False, reason)} for the expressions the oracle child answered."""
        job = Job(program=prelude + "\n", tests=tuple(grading.TestCase(call=e) for e in exprs))
        slot = self._slots[at % len(self._slots)]
        try:
            if not slot.alive():
                self._restart(slot)
            info, raw, _ = slot.execute(
                self._request(job, self.limits), self.limits.wall_s + _RESPONSE_SLACK_S, b""
            )
        except Exception:
            try:
                self._restart(slot)
            except Exception:
                pass
            return {}
        with self._lock:
            self._counts["oracle_runs"] += 1
        records, _problem = grading.parse_records(raw, self.limits.result_bytes)
        out: dict[str, tuple[bool, object]] = {}
        for r in records:
            if r.get("k") == "prog_err":
                reason = f"the test's imports failed: {r.get('exc')}"
                return {e: (False, reason) for e in exprs}
            i = r.get("i")
            if r.get("k") != "t" or type(i) is not int or not 0 <= i < len(exprs) or exprs[i] in out:
                continue
            if "v" in r:
                try:
                    out[exprs[i]] = (True, grading.untag(r["v"]))
                except (grading.BadResult, RecursionError, ValueError, OverflowError, MemoryError):
                    out[exprs[i]] = (False, "the expected value is not plain data")
            elif "exc" in r:
                out[exprs[i]] = (False, f"the expected side raised {str(r.get('exc'))[:60]}")
            else:
                out[exprs[i]] = (False, "the expected value is not plain data")
        if info.get("timed_out") and len(exprs) == 1 and not out:
            out[exprs[0]] = (False, "the expected side did not finish in the time limit")
        return out

    def _run(self, jobs: list[Job], deadline_s: float | None) -> list[Verdict]:
        t_start = time.monotonic()
        deadline = t_start + deadline_s if deadline_s is not None else None
        n = len(jobs)
        out: list[Verdict | None] = [None] * n
        pending: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        prepared: dict[str, tuple[Job, Limits]] = {}
        for i, job in enumerate(jobs):
            try:
                v, key, job, lim = self._prepare(job)
            except Exception as e:
                v, key = (
                    Verdict(Status.INFRA_ERROR, False, detail=f"bad job: {type(e).__name__}: {e}"[:300]),
                    None,
                )
            if v is not None:
                out[i] = v
                continue
            assert key is not None  # _prepare: no verdict yet, so a cache key
            pending.setdefault(key, []).append(i)
            prepared[key] = (job, lim)
        with self._lock:
            self._counts["programs"] += n
        if pending:
            if self._closed:
                for idxs in pending.values():
                    for i in idxs:
                        out[i] = Verdict(Status.INFRA_ERROR, False, detail="executor is closed")
            else:
                t0 = time.monotonic()
                self._dispatch(pending, prepared, out, deadline)
                with self._lock:
                    self._busy_s += time.monotonic() - t0
        final: list[Verdict] = []
        with self._lock:
            for v in out:
                if v is None:  # cannot happen; belt and braces for "exactly one verdict"
                    v = Verdict(Status.INFRA_ERROR, False, detail="no verdict produced")
                final.append(v)
                self._counts["status:" + v.status.value] += 1
        return final

    def _prepare(self, job: Job) -> tuple[Verdict | None, str | None, Job, Limits]:
        lim = job.limits or self.limits
        t = job.time_limit_s
        if t is not None and 0 < t < lim.wall_s:
            lim = dataclasses.replace(lim, wall_s=float(t), cpu_s=max(1, min(lim.cpu_s, math.ceil(t))))
        program = job.program
        if isinstance(program, bytes | bytearray):
            program = bytes(program).decode("utf-8", "surrogateescape")
            job = dataclasses.replace(job, program=program)
        if not isinstance(program, str):
            return Verdict(Status.INFRA_ERROR, False, detail="program is not text"), None, job, lim
        size = len(program.encode("utf-8", "surrogatepass")) + len(
            (job.setup_code or "").encode("utf-8", "replace")
        )
        if size > lim.source_bytes:
            return (
                Verdict(
                    Status.SYNTAX_ERROR, False, detail=f"source too large ({size} > {lim.source_bytes} bytes)"
                ),
                None,
                job,
                lim,
            )
        if job.child_check is not None and len(_check_bytes(job)) > MAX_CHECK_BYTES:
            return (
                Verdict(Status.INFRA_ERROR, False, detail=f"child check larger than {MAX_CHECK_BYTES} bytes"),
                None,
                job,
                lim,
            )
        if is_stdio(job.tests):  # ValueError on a mix (-> infra_error "bad job: ..."); sizes of the inputs
            if job.child_check is not None or job.setup_code:
                raise ValueError("a stdin/stdout Job takes no child_check and no setup_code")
            big = [(i, n) for i, t in enumerate(job.tests) if (n := len(_stdin_bytes(t))) > lim.stdin_bytes]
            if big:
                i, n = big[0]
                return (
                    Verdict(
                        Status.INFRA_ERROR,
                        False,
                        detail=f"test {i}: stdin of {n} bytes exceeds Limits.stdin_bytes={lim.stdin_bytes}",
                    ),
                    None,
                    job,
                    lim,
                )
        unresolved = [t for t in job.tests if t.expected_expr is not None]
        if unresolved:
            return (
                Verdict(
                    Status.INFRA_ERROR, False, detail="expected value not resolved: " + unresolved[0].source
                ),
                None,
                job,
                lim,
            )
        key = _job_key(job, lim)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self._counts["cache_hits"] += 1
                return dataclasses.replace(hit, cached=True), key, job, lim
        return None, key, job, lim

    def _dispatch(self, pending, prepared, out, deadline) -> None:
        queue = collections.deque(pending.keys())
        qlock = threading.Lock()

        def worker(slot: _Slot) -> None:
            while True:
                with qlock:
                    if not queue:
                        return
                    key = queue.popleft()
                job, lim = prepared[key]
                try:
                    v = self._execute(slot, job, lim, deadline)
                except Exception as e:  # never lose a verdict
                    v = Verdict(Status.INFRA_ERROR, False, detail=f"executor: {type(e).__name__}: {e}"[:300])
                for i in pending[key]:
                    out[i] = v
                if (
                    v.status is not Status.INFRA_ERROR
                    and v.status is not Status.TIMEOUT
                    and self.cache_size > 0
                ):
                    with self._lock:
                        self._cache[key] = v
                        while len(self._cache) > self.cache_size:
                            self._cache.popitem(last=False)

        slots = self._slots[: max(1, min(len(self._slots), len(queue)))]
        if len(slots) == 1:
            worker(slots[0])
            return
        threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _execute(self, slot: _Slot, job: Job, lim: Limits, deadline: float | None) -> Verdict:
        if is_stdio(job.tests):
            return self._execute_stdio(slot, job, lim, deadline)
        retried = False
        for _attempt in range(2):  # a worker death is retried once
            wall = self._wall(lim, deadline)
            if wall is None:
                return Verdict(Status.TIMEOUT, False, detail="batch deadline reached before the program ran")
            try:
                ooms = self._ready(slot, lim)
                info, raw, output = slot.execute(
                    self._request(job, lim, wall), wall + _RESPONSE_SLACK_S, _check_bytes(job)
                )
            except _WorkerDied as e:
                failed = self._after_death(slot, e, retried)
                if failed is not None:
                    return failed
                retried = True
                continue
            with self._lock:
                self._counts["executed"] += 1
                self._counts["leftover"] += int(info.get("leftover") or 0)
            v = grading.grade(
                job.tests,
                job.child_check is not None,
                info,
                raw,
                output,
                lim.result_bytes,
                stop_on_failure=job.stop_on_failure,
            )
            if ooms >= 0 and not v.passed and self._cg.oom_kills(slot.index) > ooms:
                with self._lock:
                    self._counts["cgroup_oom_kills"] += 1
                v = dataclasses.replace(
                    v, status=Status.MEMORY, detail="cgroup memory limit (OOM kill) " + v.detail
                )
            if retried:
                v = dataclasses.replace(v, retried=True)
            return v
        return Verdict(Status.INFRA_ERROR, False, detail="unreachable", retried=retried)

    def _execute_stdio(self, slot: _Slot, job: Job, lim: Limits, deadline: float | None) -> Verdict:
        """A stdin/stdout job: one sandboxed run per test, in order, each with the job's wall limit (capped by
        the batch deadline), its own fresh child, /tmp and tree kill; the output is compared here, or, for a
        checker-judged test whose run ended normally, judged by its checker's own sandboxed run
        (`_run_checker`). A compile error ends the job at its first test (SYNTAX_ERROR, no tests);
        stop_on_failure ends it at the first failing test; a worker death is retried once per job."""
        t_job = time.monotonic()
        results: list[TestResult] = []
        retried = False
        try:
            for i, tc in enumerate(job.tests):
                reply, retried = self._stdio_call(
                    slot,
                    lim,
                    deadline,
                    functools.partial(self._stdio_request, job, tc, lim),
                    _stdin_bytes(tc),
                    retried,
                )
                if reply is None:  # the batch deadline leaves no time for this test
                    if not results:
                        return Verdict(
                            Status.TIMEOUT, False, detail="batch deadline reached before the program ran"
                        )
                    skipped = TestResult(False, Status.TIMEOUT, 0.0, "not run: batch deadline reached")
                    results += [skipped] * (1 if job.stop_on_failure else len(job.tests) - i)
                    return grading.stdio_verdict(results, len(job.tests), time.monotonic() - t_job, retried)
                info, raw, output, answer, ooms, _wall = reply
                with self._lock:
                    self._counts["stdio_test_runs"] += 1
                    self._counts["leftover"] += int(info.get("leftover") or 0)
                oom = None  # an OOM kill in the slot's cgroup during the candidate's run (read once needed)
                if tc.checker:
                    r = grading.stdout_run_failure(tc, info, raw, output, lim.result_bytes)
                    if r is None:  # the run ended normally: its answer goes to the checker
                        oom = ooms >= 0 and self._cg.oom_kills(slot.index) > ooms  # before the checker runs
                        r, retried = self._run_checker(slot, tc, info, answer, deadline, retried)
                else:
                    r = grading.grade_stdout_test(tc, info, raw, answer, output, lim.result_bytes)
                if not r.passed and ooms >= 0:
                    if oom is None:
                        oom = self._cg.oom_kills(slot.index) > ooms
                    if oom:
                        with self._lock:
                            self._counts["cgroup_oom_kills"] += 1
                        r = dataclasses.replace(
                            r, status=Status.MEMORY, error="cgroup memory limit (OOM kill)"
                        )
                if r.status in (Status.SYNTAX_ERROR, Status.INFRA_ERROR):
                    with self._lock:
                        self._counts["executed"] += 1
                    return Verdict(
                        r.status, False, (), None, time.monotonic() - t_job, r.error, retried=retried
                    )
                results.append(r)
                if job.stop_on_failure and not r.passed:
                    break
        except _JobOver as e:
            return e.verdict
        with self._lock:
            self._counts["executed"] += 1
        return grading.stdio_verdict(results, len(job.tests), time.monotonic() - t_job, retried)

    def _stdio_request(self, job: Job, tc: grading.TestCase, lim: Limits, wall: float) -> dict:
        """The request of one stdin/stdout test: the program, the test's own output cap and, for a file-I/O
        test, the file names (in the header: the zygote opens the output file)."""
        req = self._request(job, lim, wall, _stdio_output_cap(lim, tc))
        if tc.input_file:
            req["input_file"] = tc.input_file
        if tc.output_file:
            req["output_file"] = tc.output_file
        return req

    def _stdio_call(
        self,
        slot: _Slot,
        lim: Limits,
        deadline: float | None,
        request: Callable[[float], dict],
        stdin: bytes,
        retried: bool,
    ) -> tuple[tuple | None, bool]:
        """One stdin/stdout run on `slot` (a candidate's test, or a checker), with `lim`'s wall limit capped
        by the batch deadline; `request(wall)` builds the request. ((info, records, stderr excerpt, stdout or
        output file, the slot's OOM-kill count before the run, the wall limit used), retried), or (None,
        retried) when the deadline leaves no time to start it. A worker death is retried once per job
        (`retried`: a retry was spent already); another raises _JobOver with the job's INFRA_ERROR verdict."""
        while True:
            wall = self._wall(lim, deadline)
            if wall is None:
                return None, retried
            try:
                ooms = self._ready(slot, lim)
                info, raw, output, stdout = slot.execute_stdio(request(wall), wall + _RESPONSE_SLACK_S, stdin)
                return (info, raw, output, stdout, ooms, wall), retried
            except _WorkerDied as e:
                failed = self._after_death(slot, e, retried)
                if failed is not None:
                    raise _JobOver(failed) from None
                retried = True

    def _run_checker(
        self,
        slot: _Slot,
        tc: grading.TestCase,
        info: dict,
        answer: bytes,
        deadline: float | None,
        retried: bool,
    ) -> tuple[TestResult, bool]:
        """Judge a candidate's `answer` (its run of test `tc` ended normally; `info` is that run's report) by
        the test's checker: CHECKER_RUNNER in a fresh sandboxed child on the same slot, fed the checker, the
        input, the correct output and the answer through its stdin memfd (nothing of them passes through the
        zygote's memory, and the candidate's tree is gone before it starts). The checker gets the executor's
        limits with CHECKER_WALL_S of wall and CPU time (never the job's tighter limit, which is the
        candidate's), the batch deadline permitting; files as large as its texts. (TestResult, retried)."""
        secs = float(info.get("secs") or 0.0)
        stdin, biggest = _checker_stdin(tc, answer)
        base = self.limits
        clim = dataclasses.replace(
            base,
            wall_s=grading.CHECKER_WALL_S,
            cpu_s=math.ceil(grading.CHECKER_WALL_S),
            file_bytes=max(base.file_bytes, biggest + 1),
            workdir_bytes=max(base.workdir_bytes, len(stdin) + (16 << 20)),
            stdin_bytes=max(base.stdin_bytes, len(stdin)),
        )

        def request(wall: float) -> dict:
            ld = _limits_dict(clim)
            ld["wall_s"] = wall
            return {
                "op": "run",
                "program": CHECKER_RUNNER,
                "setup": "",
                "calls": [],
                "limits": ld,
                "stop": False,
            }

        reply, retried = self._stdio_call(slot, clim, deadline, request, stdin, retried)
        if reply is None:
            return TestResult(False, Status.TIMEOUT, secs, "checker not run: batch deadline reached"), retried
        cinfo, raw, output, stdout, _ooms, wall = reply
        with self._lock:
            self._counts["checker_runs"] += 1
            self._counts["leftover"] += int(cinfo.get("leftover") or 0)
        r = grading.grade_checker(
            tc,
            secs,
            answer,
            cinfo,
            raw,
            stdout,
            output,
            clim.result_bytes,
            deadline_capped=wall < clim.wall_s,
        )
        return r, retried

    def _wall(self, lim: Limits, deadline: float | None) -> float | None:
        """The wall limit of the next run: the job's, capped by what is left of the batch deadline; None (and
        counted) when the deadline leaves no time to run it."""
        if deadline is None:
            return lim.wall_s
        left = deadline - time.monotonic()
        if left <= 0.05:
            with self._lock:
                self._counts["deadline_skipped"] += 1
            return None
        return min(lim.wall_s, left)

    def _ready(self, slot: _Slot, lim: Limits) -> int:
        """Restart a dead slot, set its cgroup's memory limit; the slot's OOM-kill count before the run."""
        if not slot.alive():
            self._restart(slot)
        if self._cg_memory[slot.index] != lim.memory_bytes:
            self._cg.set_memory(slot.index, lim.memory_bytes)
            self._cg_memory[slot.index] = lim.memory_bytes
        return self._cg.oom_kills(slot.index)

    def _after_death(self, slot: _Slot, e: Exception, retried: bool) -> Verdict | None:
        """The slot's worker died during a run: restart it; None = run the job once more (the first death),
        else the job's INFRA_ERROR verdict (a second death, or a restart that failed)."""
        with self._lock:
            self._counts["worker_deaths"] += 1
        try:
            self._restart(slot)
        except Exception as e2:
            return Verdict(
                Status.INFRA_ERROR, False, detail=f"worker restart failed: {e2}"[:300], retried=retried
            )
        if retried:
            return Verdict(Status.INFRA_ERROR, False, detail=f"worker died twice: {e}"[:300], retried=True)
        with self._lock:
            self._counts["retries"] += 1
        return None

    def _restart(self, slot: _Slot) -> None:
        with self._lock:
            self._counts["restarts"] += 1
        hello = slot.start()
        if not hello.get("ok"):
            raise RuntimeError(f"zygote restart refused: {hello.get('errors')}")

    # test hook: the pids of the zygotes (to kill one mid-batch in the crash test)
    def _zygote_pids(self) -> list[int]:
        return [s.proc.pid for s in self._slots if s.proc is not None]
