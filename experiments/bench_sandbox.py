"""Sandbox executor throughput: one JSON line per figure.

    python -m experiments.bench_sandbox [--n=400] [--slots=1,2,4,8] [--timeout_wall=1.0]

Figures: programs/s for trivial programs with N slots; programs/s for a mix with 10% timeouts, once with the
fixed wall limit --timeout_wall and once with the per-problem limit from the reference solution's measured
time (grpo_jax.codegen.timelimits: max(--floor, --factor x reference), capped by --timeout_wall); per-program
overhead (median ms of one trivial program on one slot, sequential).
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

TESTS = (TestCase("add(1, 2)", 3), TestCase("add(-1, 1)", 0))
ADD_PROBLEM = Problem(
    "add", "", "add", "def add(a, b):\n    return a + b\n", TESTS, completion_mode="program"
)


def trivial(i: int) -> Job:
    # a distinct comment per program so the result cache never answers
    return Job(f"def add(a, b):\n    return a + b\n# {i}\n", TESTS)


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
