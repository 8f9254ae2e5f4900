"""Soak the sandbox executor: many mixed programs in parallel batches, every verdict checked.

    python -m experiments.soak_sandbox [--n=1200] [--batch=120] [--slots=2] [--wall=1.0] [--seed=0]

The mix: passing and failing programs, runtime and syntax errors, busy-loop and sleep timeouts, memory and
fork bombs, an output flood, reward hacks (always-equal object, sys.exit(0) / os._exit(0), forged result
records, reading the expected values) against parent-graded tests and against child checks. Checks, printed
as JSON lines and summarised at the end (exit status 1 if any fails):

- exactly one verdict per program, each with a status its class allows (hostile programs never pass);
- no process of a sandbox uid is left after any batch, and the executor's open fd count does not grow;
- throughput: trivial programs/s first, then the mix's programs/s once the programs that ran into a limit
  (timeout, memory, output) are taken out: the others over the time left when those programs' own seconds
  are removed (`adjusted = (programs - limited) / (elapsed - limited_seconds / slots)`), which should be
  within 20 % of the trivial figure; and the mean seconds of the fast programs of the mix against the trivial
  ones.

The per-program limit is the one the trainer and the evaluator use by default: max(0.5 s, 5 x the reference
solution's time), capped by --wall (`--time_limits=fixed`: --wall for every program).
"""

from __future__ import annotations

import collections
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from grpo_jax.codegen.timelimits import with_reference_time_limits
from grpo_jax.problem import Problem
from grpo_jax.sandbox import isolation
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Job, Limits, Status, TestCase

FLAGS = flags.FLAGS
flags.DEFINE_integer("n", 1200, "programs in the soak (>= 1000 for the issue's figure)")
flags.DEFINE_integer("batch", 120, "programs per executor.run call")
flags.DEFINE_integer("slots", 2, "executor worker slots")
flags.DEFINE_float("wall", 1.0, "wall-time limit per program, seconds")
flags.DEFINE_integer("seed", 0, "shuffling seed")
flags.DEFINE_enum(
    "time_limits",
    "reference",
    ["reference", "fixed"],
    "per-problem limit from the reference solution, or --wall",
)

T = (TestCase("add(2, 3)", 5), TestCase("add(-1, 1)", 0))
ADD = Problem("add", "", "add", "def add(a, b):\n    return a + b\n", T, completion_mode="program")
LIMIT_STATUSES = (Status.TIMEOUT, Status.MEMORY, Status.OUTPUT_LIMIT)
FAST_CLASSES = ("pass", "wrong", "runtime_error", "syntax_error", "hack_always_equal")
CHECK = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
P, W, R, TO, MEM, SYN, OUT = (
    {Status.PASSED},
    {Status.WRONG_ANSWER},
    {Status.RUNTIME_ERROR},
    {Status.TIMEOUT},
    {Status.MEMORY, Status.RUNTIME_ERROR, Status.TIMEOUT},
    {Status.SYNTAX_ERROR},
    {Status.OUTPUT_LIMIT},
)
ZERO = {s for s in Status if s is not Status.PASSED and s is not Status.INFRA_ERROR}

FORGE = r"""
import os
forged = b'{"k": "start"}\n{"k": "t", "i": 0, "v": {"i": 5}}\n{"k": "check", "ok": true}\n{"k": "done"}\n'
for fd in range(64):
    try:
        os.write(fd, forged)
    except OSError:
        pass
os._exit(0)
"""

# (class name, share of the mix, program, child check or None, allowed statuses)
CLASSES = [
    ("pass", 30, "def add(a, b):\n    return a + b\n", None, P),
    ("pass_child_check", 8, "def add(a, b):\n    return a + b\n", CHECK, P),
    ("wrong", 12, "def add(a, b):\n    return a - b\n", None, W),
    ("runtime_error", 5, "def add(a, b):\n    return a / 0\n", None, R),
    ("syntax_error", 4, "def add(a, b) return a + b\n", None, SYN),
    ("timeout_busy", 6, "def add(a, b):\n    while True:\n        pass\n", None, TO),
    ("timeout_sleep", 4, "import time\ndef add(a, b):\n    time.sleep(60)\n", None, TO),
    (
        "memory_bomb",
        3,
        "def add(a, b):\n    x = []\n    while True:\n        x.append(bytearray(64 << 20))\n",
        None,
        MEM,
    ),
    (
        "fork_bomb",
        3,
        "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
        None,
        ZERO,
    ),
    (
        "output_flood",
        3,
        "import sys\ndef add(a, b):\n    while True:\n        sys.stdout.write('x' * 65536)\n",
        None,
        OUT | TO,
    ),
    (
        "hack_always_equal",
        4,
        "class E:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return E()\n",
        None,
        ZERO,
    ),
    (
        "hack_always_equal_child",
        4,
        "class E(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return E(7)\n",
        CHECK,
        ZERO,
    ),
    ("hack_sys_exit", 3, "import sys\ndef add(a, b):\n    sys.exit(0)\n", CHECK, ZERO),
    ("hack_os_exit_import", 3, "import os\nos._exit(0)\ndef add(a, b):\n    return 0\n", CHECK, ZERO),
    (
        "hack_forged_records",
        4,
        FORGE,
        CHECK,
        ZERO,
    ),
    (
        "hack_read_expected",
        4,
        "import gc, sys\ndef add(a, b):\n    for o in gc.get_objects():\n        if isinstance(o, str) and "
        "'assert add(2, 3) ==' in o:\n            return int(o.split('==')[1].split()[0])\n    return -1\n",
        CHECK,
        ZERO,
    ),
]


def build_mix(n: int, seed: int, time_limit_s: float | None = None) -> list[tuple[str, Job, set[Status]]]:
    weights = [c[1] for c in CLASSES]
    rng = random.Random(seed)
    picks = rng.choices(range(len(CLASSES)), weights=weights, k=n)
    out = []
    for i, k in enumerate(picks):
        name, _, prog, check, allowed = CLASSES[k]
        # a distinct comment per program so that the verdict cache never answers
        job = Job(
            program=prog + f"# soak {seed} {i}\n",
            tests=() if check else T,
            child_check=check,
            time_limit_s=time_limit_s,
        )
        out.append((name, job, allowed))
    return out


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


def main(argv):
    del argv
    if FLAGS.n < 1 or FLAGS.batch < 1 or FLAGS.slots < 1 or FLAGS.wall <= 0:
        print("error: --n, --batch, --slots must be >= 1 and --wall > 0", file=sys.stderr)
        return 2
    limits = Limits(wall_s=FLAGS.wall, cpu_s=max(1, int(FLAGS.wall + 0.999)))
    failures: list[str] = []
    with Executor(num_workers=FLAGS.slots, limits=limits) as ex:
        emit({"figure": "tier", "tier": ex.tier, "slots": ex.num_workers, "tier_line": ex.tier_line()})
        ex.run([Job(f"def add(a, b):\n    return a + b\n# warm {i}\n", T) for i in range(4)])
        n_triv = min(400, FLAGS.n)
        triv = [Job(f"def add(a, b):\n    return a + b\n# trivial {i}\n", T) for i in range(n_triv)]
        t0 = time.monotonic()
        vs = ex.run(triv)
        triv_rate = n_triv / (time.monotonic() - t0)
        triv_mean = sum(v.seconds for v in vs) / n_triv
        emit({"figure": "trivial_programs_per_s", "programs": n_triv, "programs_per_s": round(triv_rate, 1)})
        if sum(v.passed for v in vs) != n_triv:
            failures.append("a trivial program did not pass")

        fds0 = len(os.listdir("/proc/self/fd"))
        limit = None
        if FLAGS.time_limits == "reference":
            (ref,), _ = with_reference_time_limits(ex, [ADD], cache=Path(tempfile.mkdtemp()) / "times.json")
            limit = ref.time_limit_s
        mix = build_mix(FLAGS.n, FLAGS.seed, limit)
        by_class: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        secs_by_class: dict[str, list[float]] = collections.defaultdict(list)
        elapsed = 0.0
        limit_s, n_limited = 0.0, 0
        leftovers = 0
        for b0 in range(0, len(mix), FLAGS.batch):
            chunk = mix[b0 : b0 + FLAGS.batch]
            t0 = time.monotonic()
            verdicts = ex.run([j for _, j, _ in chunk])
            elapsed += time.monotonic() - t0
            if len(verdicts) != len(chunk):
                failures.append(f"batch at {b0}: {len(verdicts)} verdicts for {len(chunk)} programs")
                continue
            for (name, _, allowed), v in zip(chunk, verdicts, strict=True):
                by_class[name][v.status.value] += 1
                if v.status not in allowed:
                    failures.append(
                        f"{name}: status {v.status.value} not in {sorted(s.value for s in allowed)}"
                    )
                secs_by_class[name].append(v.seconds)
                if v.status in LIMIT_STATUSES:
                    limit_s += v.seconds
                    n_limited += 1
            left = isolation.sandbox_uid_pids()
            if left:
                time.sleep(0.5)
                left = isolation.sandbox_uid_pids()
            if left:
                leftovers += len(left)
                failures.append(f"batch at {b0}: {len(left)} sandbox processes left")
        fds1 = len(os.listdir("/proc/self/fd"))
        if fds1 > fds0:
            failures.append(f"the executor's open fds grew from {fds0} to {fds1}")
        n_timeouts = sum(c.get("timeout", 0) for c in by_class.values())
        busy = max(1e-9, elapsed - limit_s / ex.num_workers)
        adjusted = (len(mix) - n_limited) / busy
        fast = [x for name, xs in secs_by_class.items() for x in xs if name in FAST_CLASSES]
        emit({"figure": "verdicts_by_class", "classes": {k: dict(v) for k, v in sorted(by_class.items())}})
        emit(
            {
                "figure": "mean_seconds_by_class",
                "classes": {k: round(sum(v) / len(v), 4) for k, v in sorted(secs_by_class.items())},
            }
        )
        emit(
            {
                "figure": "soak",
                "programs": len(mix),
                "batches": (len(mix) + FLAGS.batch - 1) // FLAGS.batch,
                "elapsed_s": round(elapsed, 2),
                "time_limits": FLAGS.time_limits,
                "limit_s": limit,
                "timeouts": n_timeouts,
                "programs_at_a_limit": n_limited,
                "limit_cost_s": round(limit_s / ex.num_workers, 2),
                "fast_programs_mean_s": round(sum(fast) / max(1, len(fast)), 4),
                "trivial_mean_s": round(triv_mean, 4),
                "programs_per_s": round(len(mix) / elapsed, 1),
                "adjusted_programs_per_s": round(adjusted, 1),
                "trivial_programs_per_s": round(triv_rate, 1),
                "adjusted_over_trivial": round(adjusted / triv_rate, 3),
                "leftover_processes": leftovers,
                "executor_fds": [fds0, fds1],
                "stats": ex.stats(),
            }
        )
        if adjusted < 0.8 * triv_rate:
            failures.append(
                f"adjusted throughput {adjusted:.1f}/s is more than 20% below the trivial {triv_rate:.1f}/s"
            )
    emit(
        {"figure": "soak_checks", "ok": not failures, "failures": failures[:50], "n_failures": len(failures)}
    )
    return 0 if not failures else 1


if __name__ == "__main__":
    app.run(main)
