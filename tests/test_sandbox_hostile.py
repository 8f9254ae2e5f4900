"""The hostile corpus (tests/sandbox_corpus) through the real executor.

Asserts for every entry: the verdict status is one of the expected ones (hostile -> reward 0, legit -> 1),
each program's verdict arrives within its limit + 3 s, the parent is alive, no process of a sandbox uid is
left, sentinel files outside the sandbox are intact, no marker appears, no loopback connection arrives and the
canary never leaves the parent.

The whole corpus needs a tier with pid/mount/network namespaces (root, or unprivileged user namespaces).
Without them the corpus tests skip, loudly, naming the tier and what it lacks; with
GRPO_REQUIRE_SANDBOX_NAMESPACES=1 (set by .ci/run) a missing namespace tier is a FAILURE instead. On any tier,
the entries whose expectations do not depend on namespaces (`NAMESPACE_FREE`: reward hacking, timeouts,
malformed input) still run, so a laptop checks grading. GRPO_SANDBOX_TEST_TIER=<tier> (e.g. rlimits-only)
forces the executor's tier, to try the laptop path on a machine that has namespaces.
"""

from __future__ import annotations

import ast
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_jax.codegen.datasets import MBPP_PATH
from grpo_jax.sandbox import isolation
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Job, Limits, Status
from grpo_jax.sandbox.types import TestCase as TC

CORPUS = Path(__file__).parent / "sandbox_corpus"
LIMITS = Limits(wall_s=2.0, cpu_s=2)
# legit controls and memory exhaustion get more time: they are CPU/page-fault heavy and share 2 loaded cores
SLOW_LIMITS = Limits(wall_s=6.0, cpu_s=6)
CANARY = "canary-7f3a9c-do-not-leak"
REQUIRE_NAMESPACES = os.environ.get("GRPO_REQUIRE_SANDBOX_NAMESPACES") == "1"
TEST_TIER = os.environ.get("GRPO_SANDBOX_TEST_TIER") or "auto"
NAMESPACES = ("pid_namespace", "mount_namespace_minimal_root", "network_namespace")
# corpus entries whose expected verdicts hold on every tier (they attack the grading, not the host)
NAMESPACE_FREE = ("hack_", "timeout_", "input_")


def load_corpus(subst: dict[str, str]) -> list[tuple[str, Job, set[Status], str]]:
    cases = []
    for path in sorted(CORPUS.glob("*.prog")):
        text = path.read_text()
        for k, v in subst.items():
            text = text.replace("{" + k + "}", v)
        header = {}
        for line in text.splitlines()[:4]:
            key, _, val = line[2:].partition(":")
            header[key.strip()] = val.strip()
        expect = {Status(s) for s in header["expect"].split("|")}
        tc = TC(call=header["call"], expected=ast.literal_eval(header["expected"]))
        lim = SLOW_LIMITS if header["class"] in ("legit", "exhaustion") else LIMITS
        cases.append((path.stem, Job(program=text, tests=(tc,), limits=lim), expect, header["class"]))
    return cases


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    os.environ["GRPO_SANDBOX_CANARY"] = CANARY  # must never reach a child (cleared env)
    sdir = tmp_path_factory.mktemp("sentinels")
    os.chmod(sdir, 0o777)
    sentinel = sdir / "sentinel.txt"
    sentinel.write_text("intact")
    os.chmod(sentinel, 0o666)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    marker = f"/tmp/grpo_sandbox_marker_{os.getpid()}"
    subst = {
        "SENTINEL_DIR": str(sdir),
        "MARKER": marker,
        "PORT": str(listener.getsockname()[1]),
        "CANARY": CANARY,
        "DATASET": str(MBPP_PATH),
    }
    ex = Executor(num_workers=4, limits=LIMITS, tier=TEST_TIER)
    yield {
        "ex": ex,
        "sentinel": sentinel,
        "sdir": sdir,
        "listener": listener,
        "marker": marker,
        "subst": subst,
    }
    ex.close()
    listener.close()
    os.environ.pop("GRPO_SANDBOX_CANARY", None)


def missing_namespaces(ex: Executor) -> str:
    """'' if the tier has every namespace; else what it lacks, why, and why the stronger tiers failed."""
    report = ex.tier_report()
    lacking = [k for k in NAMESPACES if not report["active"][k]]
    if not lacking:
        return ""
    why = "; ".join(f"{k}: {report['missing'].get(k, 'not observed')}" for k in lacking)
    tried = f"; stronger tiers failed: {report['errors']}" if report.get("errors") else ""
    return f"sandbox tier {ex.tier!r} lacks {', '.join(lacking)} ({why}{tried})"


def needs_namespaces(ex: Executor) -> None:
    lacking = missing_namespaces(ex)
    if lacking and REQUIRE_NAMESPACES:
        pytest.fail(f"GRPO_REQUIRE_SANDBOX_NAMESPACES=1 but {lacking}")
    if lacking:
        pytest.skip(f"{lacking}; set GRPO_REQUIRE_SANDBOX_NAMESPACES=1 to make this a failure")


def check_corpus(ex: Executor, cases) -> None:
    """Run `cases` as one batch: every verdict as expected, no hostile program scores 1, in time."""
    jobs = [c[1] for c in cases]
    t0 = time.monotonic()
    verdicts = ex.run(jobs)
    elapsed = time.monotonic() - t0
    assert len(verdicts) == len(jobs)
    bad = []
    for (name, _job, expect, klass), v in zip(cases, verdicts, strict=True):
        if v.status not in expect:
            bad.append(
                f"{name}: got {v.status.value} ({v.detail[:160]}), want {sorted(s.value for s in expect)}"
            )
        if klass != "legit" and name != "input_binary_output" and v.passed:
            bad.append(f"{name}: hostile program scored 1")
        if v.seconds > _job.limits.wall_s + 3:
            bad.append(f"{name}: took {v.seconds:.1f}s")
    assert not bad, f"tier {ex.tier}:\n" + "\n".join(bad)
    # the whole batch on 4 slots: bounded by (number of slow entries / slots) x (limit + 3 s)
    assert elapsed < len(jobs) * (SLOW_LIMITS.wall_s + 3) / 4 + 10


def test_corpus_grading_on_any_tier(env):
    """The namespace-free part of the corpus (reward hacks, timeouts, malformed input) on whatever tier this
    machine gives: grading must hold even where isolation is weak. Where the tier has namespaces, the full
    corpus test below runs these same entries too."""
    ex: Executor = env["ex"]
    cases = [c for c in load_corpus(env["subst"]) if c[0].startswith(NAMESPACE_FREE)]
    assert len(cases) >= 20 and {c[3] for c in cases} == {"hack", "timeout", "input"}
    if not missing_namespaces(ex):
        pytest.skip(
            f"tier {ex.tier} has namespaces: test_corpus_verdicts_and_host_unharmed runs these entries"
        )
    check_corpus(ex, cases)


def test_corpus_verdicts_and_host_unharmed(env):
    ex: Executor = env["ex"]
    needs_namespaces(ex)
    cases = load_corpus(env["subst"])
    assert len(cases) >= 50
    check_corpus(ex, cases)
    # host checks, a little after the batch (daemons would have acted by now)
    time.sleep(2.0)
    assert env["sentinel"].read_text() == "intact"
    assert sorted(p.name for p in env["sdir"].iterdir()) == ["sentinel.txt"]
    for p in (
        "/tmp/grpo_escape_probe",
        "/var/tmp/grpo_escape_probe",
        "/dev/shm/grpo_escape_probe",
        "/root/grpo_escape_probe",
        "/etc/grpo_escape_probe",
        "/usr/grpo_escape_probe",
        env["marker"],
    ):
        assert not os.path.exists(p), p
    assert isolation.stray_sandbox_pids(ex.uids) == []
    with pytest.raises(socket.timeout):
        env["listener"].accept()
    # the parent and the executor still work after all that
    ok = ex.run([Job("def f(x):\n    return x + 1\n", (TC("f(1)", 2),))])[0]
    assert ok.passed, ok
    assert os.environ["GRPO_SANDBOX_CANARY"] == CANARY


def test_canary_and_expected_values_never_reach_the_child(env):
    ex: Executor = env["ex"]
    cases = {c[0]: c for c in load_corpus(env["subst"])}
    v_env, v_steal = ex.run([cases["escape_env_canary"][1], cases["hack_steal_expected"][1]])
    assert not v_env.passed and not v_steal.passed
    assert CANARY not in v_env.detail and "4242424242" not in v_steal.detail


def test_big_source_rejected_fast(env):
    ex: Executor = env["ex"]
    t0 = time.monotonic()
    v = ex.run([Job("x = 1\n" * ((10 << 20) // 6), (TC("x", 1),))])[0]
    assert v.status is Status.SYNTAX_ERROR and "too large" in v.detail
    assert time.monotonic() - t0 < 1.0


def test_non_utf8_source(env):
    ex: Executor = env["ex"]
    prog = b"def f(x):\n    return x + 1\n# \xff\xfe\n".decode("utf-8", "surrogateescape")
    v = ex.run([Job(prog, (TC("f(1)", 2),))])[0]
    assert v.status is Status.SYNTAX_ERROR
    v2 = ex.run([Job(b"def f(x):\n    return x + 1\n", (TC("f(1)", 2),))])[0]  # bytes accepted
    assert v2.passed


def test_soak_shuffled_mixed(env):
    """The fast part of the corpus, shuffled and repeated with 4 slots: no verdict lost or duplicated, the
    same verdicts as in isolation, no fd or mount leak in the parent, no leftover processes."""
    ex: Executor = env["ex"]
    needs_namespaces(ex)
    fast = [
        c
        for c in load_corpus(env["subst"])
        if c[3] in ("hack", "input", "legit") and c[0] not in ("legit_memory_cpu",)
    ]
    # distinct programs per repetition so the cache does not answer
    rng = random.Random(0)
    fds0 = len(os.listdir("/proc/self/fd"))
    mounts0 = Path("/proc/self/mountinfo").read_text()
    rounds = []
    for rep in range(3):
        batch = []
        for name, job, expect, _ in fast * 4:
            prog = job.program + f"\n# rep {rep} {len(batch)}\n"
            batch.append((name, Job(prog, job.tests, limits=job.limits), expect))
        rng.shuffle(batch)
        t0 = time.monotonic()
        vs = ex.run([b[1] for b in batch])
        rounds.append(len(batch) / (time.monotonic() - t0))
        assert len(vs) == len(batch)
        pairs = zip(batch, vs, strict=True)
        wrong = [(n, v.status.value, v.detail[:120]) for (n, _, e), v in pairs if v.status not in e]
        assert not wrong, wrong
    assert len(os.listdir("/proc/self/fd")) <= fds0 + 2
    assert Path("/proc/self/mountinfo").read_text() == mounts0
    assert isolation.stray_sandbox_pids(ex.uids) == []


def _cli(problems: Path, samples: Path, out: Path) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", f"--problems={problems}", f"--samples={samples}"]
        + [f"--out={out}", "--k=1", "--workers=4", f"--timeout={SLOW_LIMITS.wall_s}"],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_corpus_through_the_evaluator_cli(env, tmp_path):
    """The whole corpus as an MBPP-format problems file (every assert parent-graded) and as a HumanEval-format
    file whose check() runs the assert in a loop (so it stays child-side: the two-process checker), through
    `python -m experiments.evaluate`: no hostile program passes, the legit ones do, the task ids come back
    unchanged, one result line per sample in order, and the grading class is stated per sample."""
    needs_namespaces(env["ex"])
    cases = load_corpus(env["subst"])
    mbpp, he, samples = [], [], []
    for i, (name, job, _expect, _klass) in enumerate(cases):
        tc = job.tests[0]
        assert tc.call.startswith("f(")
        exp = repr(tc.expected)
        mbpp.append(
            {
                "task_id": f"hostile/{name}",
                "text": name,
                "code": "",
                "test_list": [f"assert {tc.call} == {exp}"],
            }
        )
        check = (
            f"def check(candidate):\n    for _ in range(1):\n        assert candidate{tc.call[1:]} == {exp}\n"
        )
        he.append(
            {
                "task_id": f"he-{name}",
                "prompt": "",
                "entry_point": "f",
                "canonical_solution": "",
                "test": check,
            }
        )
        samples.append((name, i, job.program))
    for fmt, rows, tid in (
        ("mbpp", mbpp, lambda n, i: f"hostile/{n}"),
        ("humaneval", he, lambda n, i: f"he-{n}"),
    ):
        pf, sf, of = (
            tmp_path / f"{fmt}.jsonl",
            tmp_path / f"{fmt}_samples.jsonl",
            tmp_path / f"{fmt}_out.jsonl",
        )
        pf.write_text("".join(json.dumps(r) + "\n" for r in rows))
        # the samples in another order than the problems, to see the order kept
        order = list(reversed(samples))
        sf.write_text(
            "".join(json.dumps({"task_id": tid(n, i), "completion": prog}) + "\n" for n, i, prog in order)
        )
        summary = _cli(pf, sf, of)
        res = [json.loads(line) for line in of.read_text().splitlines()]
        assert [r["task_id"] for r in res] == [tid(n, i) for n, i, _ in order]
        bad = []
        for (name, i, _), r in zip(order, res, strict=True):
            _, _, expect, klass = cases[i]
            legit = klass == "legit" or name == "input_binary_output"
            if r["passed"] != legit:
                bad.append(f"{fmt} {name}: passed={r['passed']} ({r['result']}: {r['detail'][:160]})")
            if fmt == "mbpp" and Status(r["result"]) not in expect:
                bad.append(f"{fmt} {name}: {r['result']} not in {sorted(s.value for s in expect)}")
            if r["result"] == "infra_error":
                bad.append(f"{fmt} {name}: infra_error {r['detail'][:160]}")
        assert not bad, "\n".join(bad)
        want = "parent" if fmt == "mbpp" else "child"
        assert {r["grading"] for r in res} == {want} and summary["grading"] == {want: len(res)}
    assert isolation.stray_sandbox_pids() == []  # the CLI's executor is gone: none of its uids is held
    assert env["sentinel"].read_text() == "intact"


def test_a_process_left_with_a_free_sandbox_uid_is_a_stray_and_a_held_one_is_not():
    """The leftover-process check of the tests above: a process of a sandbox uid that no live executor holds
    is a stray; one of a uid leased by a live executor (another test's programs running) is not, unless the
    caller names that uid as its own."""
    if os.geteuid() != 0:
        pytest.skip("needs root (setuid to a sandbox uid)")
    lease = isolation.UidLease()
    held = lease.acquire()
    spare = isolation.UID_BASE + isolation.UID_COUNT - 1  # leases go lowest first: nobody holds the last
    assert not isolation.uid_leased(spare)
    procs = [subprocess.Popen(["sleep", "30"], user=uid) for uid in (held, spare)]
    try:
        time.sleep(0.2)
        strays = isolation.stray_sandbox_pids()
        assert procs[1].pid in strays and procs[0].pid not in strays
        assert procs[0].pid in isolation.stray_sandbox_pids(own_uids=(held,))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        lease.release_all()
