"""Sandbox executor throughput: one JSON line per figure.

    python -m experiments.bench_sandbox [--n=400] [--slots=1,2,4,8] [--timeout_wall=1.0] [--stdio_tests=10]

Figures: programs/s for trivial programs with N slots (the assert workload: 2 parent-graded calls in one
child); programs/s for a mix with 10% timeouts, once with the fixed wall limit --timeout_wall and once with
the per-problem limit from the reference solution's measured time (grpo_jax.codegen.timelimits: max(--floor,
--factor x reference), capped by --timeout_wall); the competitive-programming workloads with N slots:
--n programs x --stdio_tests stdin/stdout tests with small inputs (one sandboxed run per test), the same
programs as call-based json_eq tests (one child per program), and --big_n programs reading a
--big_input_mb MB input; per-program overhead (median ms of one trivial program on one slot, sequential).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from absl import app, flags

from grpo_jax.codegen.timelimits import with_reference_time_limits
from grpo_jax.problem import Problem
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Job, Limits, TestCase

FLAGS = flags.FLAGS
flags.DEFINE_integer("n", 400, "programs per throughput figure")
flags.DEFINE_string("slots", "1,2,4,8", "worker slot counts")
flags.DEFINE_float("timeout_wall", 1.0, "wall limit for the timeout mix, seconds")
flags.DEFINE_float("floor", 0.5, "per-problem limits: the floor, seconds")
flags.DEFINE_float("factor", 5.0, "per-problem limits: the multiple of the reference time")
flags.DEFINE_integer("stdio_tests", 10, "stdin/stdout and call-based workloads: tests per program")
flags.DEFINE_integer("big_n", 20, "programs of the large-input stdin/stdout workload")
flags.DEFINE_float("big_input_mb", 1.0, "input size of the large-input workload, MB")

TESTS = (TestCase("add(1, 2)", 3), TestCase("add(-1, 1)", 0))
ADD_PROBLEM = Problem(
    "add", "", "add", "def add(a, b):\n    return a + b\n", TESTS, completion_mode="program"
)


def trivial(i: int) -> Job:
    # a distinct comment per program so the result cache never answers
    return Job(f"def add(a, b):\n    return a + b\n# {i}\n", TESTS)


def stdio_job(i: int, m: int) -> Job:
    """a + b over stdin, `m` tests (a distinct comment per program: the cache never answers)."""
    tests = tuple(TestCase("", kind="stdout", stdin=f"{i} {j}\n", expected=f"{i + j}\n") for j in range(m))
    return Job(f"a, b = map(int, input().split())\nprint(a + b)\n# {i}\n", tests)


def call_job(i: int, m: int) -> Job:
    """The same task as call-based json_eq tests, `m` calls in one child."""
    tests = tuple(TestCase(f"add(*[{i}, {j}])", i + j, kind="json_eq") for j in range(m))
    return Job(f"def add(a, b):\n    return a + b\n# {i}\n", tests)


def big_input_job(i: int, text: str, total: int) -> Job:
    return Job(
        f"import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n# {i}\n",
        (TestCase("", kind="stdout", stdin=text, expected=f"{total}\n"),),
    )


def _figure(name: str, ex: Executor, jobs: list[Job], tests_per_job: int, **extra) -> None:
    t0 = time.monotonic()
    vs = ex.run(jobs)
    dt = time.monotonic() - t0
    print(
        json.dumps(
            {
                "figure": name,
                "slots": ex.num_workers,
                **extra,
                "programs": len(jobs),
                "tests": len(jobs) * tests_per_job,
                "passed": sum(v.passed for v in vs),
                "seconds": round(dt, 3),
                "programs_per_s": round(len(jobs) / dt, 1),
                "tests_per_s": round(len(jobs) * tests_per_job / dt, 1),
            }
        ),
        flush=True,
    )


def competitive(ex: Executor, n_slots: int) -> None:
    """The stdin/stdout and call-based workloads (figures next to the assert workload's, same executor)."""
    m = FLAGS.stdio_tests
    ex.run([stdio_job(-1 - j, 2) for j in range(n_slots * 2)])  # warm up
    base = 10_000_000 * n_slots
    _figure("stdio_programs_per_s", ex, [stdio_job(base + i, m) for i in range(FLAGS.n)], m, input="small")
    _figure("call_json_eq_programs_per_s", ex, [call_job(base + i, m) for i in range(FLAGS.n)], m)
    k = int(FLAGS.big_input_mb * (1 << 20) / 8)  # numbers of 7 digits and a newline
    text = "".join(f"{1_000_000 + x}\n" for x in range(k))
    total = sum(1_000_000 + x for x in range(k))
    jobs = [big_input_job(base + i, text, total) for i in range(FLAGS.big_n)]
    _figure("stdio_big_input_programs_per_s", ex, jobs, 1, input_mb=round(len(text) / (1 << 20), 2))


def main(argv):
    del argv
    slots = [int(s) for s in FLAGS.slots.split(",")]
    for n_slots in slots:
        with Executor(num_workers=n_slots, limits=Limits(wall_s=FLAGS.timeout_wall, cpu_s=2)) as ex:
            ex.run([trivial(-1 - j) for j in range(n_slots * 2)])  # warm up
            jobs = [trivial(i + 1000 * n_slots) for i in range(FLAGS.n)]
            t0 = time.monotonic()
            vs = ex.run(jobs)
            dt = time.monotonic() - t0
            ok = sum(v.passed for v in vs)
            print(
                json.dumps(
                    {
                        "figure": "trivial_programs_per_s",
                        "slots": n_slots,
                        "tier": ex.tier,
                        "programs": len(jobs),
                        "passed": ok,
                        "seconds": round(dt, 3),
                        "programs_per_s": round(len(jobs) / dt, 1),
                    }
                ),
                flush=True,
            )
            (ref,), _ = with_reference_time_limits(
                ex,
                [ADD_PROBLEM],
                floor_s=FLAGS.floor,
                factor=FLAGS.factor,
                cache=Path(tempfile.mkdtemp()) / "t",
            )
            for name, limit in (("fixed", None), ("reference", ref.time_limit_s)):
                mix = []
                for i in range(FLAGS.n):
                    if i % 10 == 0:
                        prog = f"def add(a, b):\n    while True:\n        pass\n# {name} {i}-{n_slots}\n"
                    else:
                        prog = trivial(i + 100000 + 1000 * n_slots).program + f"# {name}\n"
                    mix.append(Job(prog, TESTS, time_limit_s=limit))
                t0 = time.monotonic()
                vs = ex.run(mix)
                dt = time.monotonic() - t0
                print(
                    json.dumps(
                        {
                            "figure": "mix_10pct_timeouts_programs_per_s",
                            "time_limits": name,
                            "slots": n_slots,
                            "limit_s": limit or FLAGS.timeout_wall,
                            "programs": len(mix),
                            "timeouts": sum(v.status.value == "timeout" for v in vs),
                            "passed": sum(v.passed for v in vs),
                            "seconds": round(dt, 3),
                            "programs_per_s": round(len(mix) / dt, 1),
                        }
                    ),
                    flush=True,
                )
            competitive(ex, n_slots)
    with Executor(num_workers=1) as ex:
        lat = []
        for i in range(100):
            t0 = time.monotonic()
            ex.run([trivial(10_000_000 + i)])
            lat.append((time.monotonic() - t0) * 1000)
        lat.sort()
        print(
            json.dumps(
                {
                    "figure": "per_program_overhead_ms",
                    "slots": 1,
                    "median_ms": round(statistics.median(lat), 2),
                    "p90_ms": round(lat[int(0.9 * len(lat))], 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    app.run(main)
