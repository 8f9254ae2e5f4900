"""The main job on several devices and processes (launch/local.py, jax.distributed with gloo on 127.0.0.1):
the same final parameters (<= 1e-6) and metrics as on one device for 2 processes x 2 devices, 1 process x 4
devices, a data x fsdp and a data x tensor mesh (with the chunked LM head); a process killed mid-run ends the
other with an error naming it, and the rerun resumes to the bit-identical end of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAGS = "--flagfile=experiments/flagfiles/dist_test.flags"
NOISY = ("time", "throughput/", "sandbox/programs_per_s", "memory/")  # host timings, clocks, memory peaks
TOL = 1e-6


def _env(devices: int | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _single(wd: Path, devices: int = 1, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "experiments.codegen", FLAGS, f"--workdir={wd}", *flags]
    return subprocess.run(cmd, cwd=ROOT, env=_env(devices), capture_output=True, text=True, timeout=600)


def _launch_cmd(wd: Path, *flags: str) -> list[str]:
    own = ["--num_processes=2", "--devices_per_process=2", "--grace_s=60"]
    return [sys.executable, "launch/local.py", *own, "--", FLAGS, f"--workdir={wd}", *flags]


def _launch(wd: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _launch_cmd(wd, *flags), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600
    )


def _ok(proc, wd):
    logs = (
        "".join(p.read_text()[-2000:] for p in sorted((Path(wd) / "logs").glob("*.log")))
        if (Path(wd) / "logs").exists()
        else ""
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:] + logs


def _params(wd: Path):
    from grpo_jax.train.export import open_checkpoint

    r, state = open_checkpoint(str(wd), print_fn=lambda *a: None)
    try:
        return jax.device_get(state.train.params)
    finally:
        r.ckpt.close()


def _metrics(wd: Path) -> list[dict]:
    lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in x.items() if not k.startswith(NOISY)} for x in lines if "reward" in x]


def _param_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _metric_diff(a: list[dict], b: list[dict]) -> float:
    assert [x["step"] for x in a] == [x["step"] for x in b] == [1, 2, 3]
    assert set(a[0]) == set(b[0])
    return max(abs(x[k] - y[k]) / max(1.0, abs(x[k])) for x, y in zip(a, b, strict=True) for k in x)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("dist")
    out = {}
    for name, go in {
        "1x1": lambda wd: _single(wd, 1),
        "1x4 data2 fsdp2": lambda wd: _single(wd, 4, "--mesh_fsdp=2"),
        # the tensor mesh with the chunked LM head (policies/logp.py), which then runs sharded too
        "1x4 data2 tensor2 chunked head": lambda wd: _single(wd, 4, "--mesh_tensor=2", "--logp_chunk=4"),
        "2x2 data2 fsdp2": lambda wd: _launch(wd, "--mesh_fsdp=2"),
    }.items():
        wd = base / name.replace(" ", "_")
        t = time.perf_counter()
        proc = go(wd)
        _ok(proc, wd)
        out[name] = dict(wd=wd, seconds=time.perf_counter() - t, stdout=proc.stdout)
    return out


def test_every_layout_equals_one_device(runs):
    ref_p, ref_m = _params(runs["1x1"]["wd"]), _metrics(runs["1x1"]["wd"])
    moved = _param_diff(ref_p, _params_at(runs["1x1"]["wd"], 0))
    assert moved > 1e-5, moved  # three steps really changed the parameters
    assert ref_m[-1]["pool/size"] == 2  # the pool (K split over data where data divides it) took part
    for name in ("1x4 data2 fsdp2", "1x4 data2 tensor2 chunked head", "2x2 data2 fsdp2"):
        wd = runs[name]["wd"]
        assert _param_diff(ref_p, _params(wd)) <= TOL, (name, _param_diff(ref_p, _params(wd)))
        assert _metric_diff(ref_m, _metrics(wd)) <= TOL, (name, _metric_diff(ref_m, _metrics(wd)))
    res = json.loads((runs["2x2 data2 fsdp2"]["wd"] / "results.json").read_text())
    assert (res["processes"], res["devices"]) == (2, 4)
    assert (
        "mesh: data 2 x fsdp 2 x tensor 1 over 4 cpu devices in 2 process(es)"
        in runs["2x2 data2 fsdp2"]["stdout"]
    )
    # one writer: process 1 wrote no results, metrics or TensorBoard (its log holds no step lines)
    assert "step 1/3" not in (runs["2x2 data2 fsdp2"]["wd"] / "logs" / "process_1.log").read_text()


def _params_at(wd: Path, step: int):
    from grpo_jax.train.export import open_checkpoint

    r, state = open_checkpoint(str(wd), step, print_fn=lambda *a: None)
    try:
        return jax.device_get(state.train.params)
    finally:
        r.ckpt.close()


def test_killed_process_ends_the_other_and_the_rerun_resumes_bit_identically(runs, tmp_path):
    """SIGKILL process 1 after the step-1 checkpoint: process 0 exits non-zero naming process 1 within a
    bounded time; the same command again resumes and ends with the uninterrupted run's exact parameters."""
    wd = tmp_path / "killed"
    launcher = subprocess.Popen(
        _launch_cmd(wd, "--mesh_fsdp=2"),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not (wd / "checkpoints" / "1").is_dir():
        assert launcher.poll() is None and time.time() < deadline, launcher.communicate()
        time.sleep(0.02)
    pids = json.loads((wd / "logs" / "pids.json").read_text())
    os.kill(pids["1"], signal.SIGKILL)
    t_kill = time.time()
    out, err = launcher.communicate(timeout=120)
    ended = time.time() - t_kill
    assert launcher.returncode != 0
    assert not (wd / "results.json").exists()  # the run really was cut short
    log0 = (wd / "logs" / "process_0.log").read_text()
    assert "error: lost process 1 of 2" in log0, log0[-3000:]
    assert "exit 75" in log0
    assert ended < 10 + 30, ended  # --dist_heartbeat_s=10 (dist_test.flags) plus start-up slack

    proc = _launch(wd, "--mesh_fsdp=2")
    _ok(proc, wd)
    assert "resumed from" in proc.stdout
    want = json.loads((runs["2x2 data2 fsdp2"]["wd"] / "results.json").read_text())["final_params_sha256"]
    got = json.loads((wd / "results.json").read_text())["final_params_sha256"]
    assert got == want


def test_stall_message_names_the_processes_behind_or_says_this_one_is():
    from grpo_jax.train.distributed import _stall_message

    pr = {"count": 7, "label": "step 2: train step", "since": 0.0}
    msg = _stall_message(0, pr, {1: (6, "step 2: rollout"), 2: (7, "step 2: train step")}, 20.0, 15)
    assert msg == (
        "process 0 made no progress for 20 s at 'step 2: train step' (--dist_step_timeout_s=15): "
        "process 1 at 'step 2: rollout' did not get here (hung)"
    )
    behind = {"count": 6, "label": "step 2: rollout", "since": 0.0}
    assert "this process is the one behind (process 0 reached 'step 2: train step')" in _stall_message(
        1, behind, {0: (7, "step 2: train step")}, 20.0, 15
    )
    assert "every process is at the same point" in _stall_message(0, pr, {1: (7, "x")}, 20.0, 15)


def test_single_process_context_needs_no_coordinator():
    from grpo_jax.train.distributed import Context

    ctx = Context()
    assert ctx.allgather_objects("x", {"a": 1}) == [{"a": 1}]
    assert ctx.broadcast_object("y", lambda: 3) == 3
    ctx.barrier("z")  # no-op with one process
    assert ctx.is_main and not ctx.multi
