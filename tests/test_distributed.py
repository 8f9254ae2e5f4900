"""The main job on several devices and processes (launch/local.py, jax.distributed with gloo on 127.0.0.1):
the same final parameters (<= 1e-6) and metrics as on one device for 1 process x 4 devices (data x
tensor, with the chunked LM head; the devices made by --mesh_cpu_devices) and 2 processes x 2 devices (data x
fsdp). The 2-process run is the one whose
process 1 is SIGKILLed after its step-1 checkpoint: process 0 ends with an error naming it, and the same
command resumes and ends where one device ends (a resume that drew other samples or lost the optimizer state
would be far outside 1e-6; the single-process resume is bit-exact, tests/test_codegen_e2e.py)."""

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
    """The environment of a run on `devices` forced CPU devices (other XLA flags of this process kept)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    flags = [f for f in env.pop("XLA_FLAGS", "").split() if "device_count" not in f]
    if devices:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    return env


def _single(wd: Path, devices: int | None = 1, *flags: str) -> subprocess.CompletedProcess:
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
    """The reference on this process's one device (in-process), and a data x tensor mesh of 4 forced devices
    in one process (the real main job)."""
    import mainjob

    base = tmp_path_factory.mktemp("dist")
    with mainjob.executor() as ex:
        mainjob.run(FLAGS, workdir=base / "1x1", executor=ex)
    wd = base / "1x4"
    # the tensor mesh with the chunked LM head (policies/logp.py), which then runs sharded too; the 4 CPU
    # devices by the main job's own flag (the 2-process test below forces them by XLA_FLAGS)
    proc = _single(wd, None, "--mesh_cpu_devices=4", "--mesh_tensor=2", "--logp_chunk=4")
    _ok(proc, wd)
    assert "mesh: data 2 x fsdp 1 x tensor 2 over 4 cpu devices in 1 process(es)" in proc.stdout
    return {"1x1": base / "1x1", "1x4 data2 tensor2 chunked head": wd}


def _equals_one_device(runs, name, wd):
    ref_p, ref_m = _params(runs["1x1"]), _metrics(runs["1x1"])
    assert _param_diff(ref_p, _params(wd)) <= TOL, (name, _param_diff(ref_p, _params(wd)))
    assert _metric_diff(ref_m, _metrics(wd)) <= TOL, (name, _metric_diff(ref_m, _metrics(wd)))


def test_a_mesh_in_one_process_equals_one_device(runs):
    moved = _param_diff(_params(runs["1x1"]), _params_at(runs["1x1"], 0))
    assert moved > 1e-5, moved  # three steps really changed the parameters
    assert _metrics(runs["1x1"])[-1]["pool/size"] == 2  # the pool (K split over data) took part
    _equals_one_device(runs, "1x4 data2 tensor2 chunked head", runs["1x4 data2 tensor2 chunked head"])


def _params_at(wd: Path, step: int):
    from grpo_jax.train.export import open_checkpoint

    r, state = open_checkpoint(str(wd), step, print_fn=lambda *a: None)
    try:
        return jax.device_get(state.train.params)
    finally:
        r.ckpt.close()


def test_two_processes_killed_one_ends_the_other_and_the_rerun_equals_one_device(runs, tmp_path):
    """2 processes x 2 devices, data x fsdp: SIGKILL process 1 after the step-1 checkpoint; process 0 exits
    non-zero naming process 1 within a bounded time; the same command again resumes, and the run's final
    parameters and every logged metric equal the one-device run's."""
    wd = tmp_path / "2x2"
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
    assert "mesh: data 2 x fsdp 2 x tensor 1 over 4 cpu devices in 2 process(es)" in proc.stdout
    res = json.loads((wd / "results.json").read_text())
    assert (res["processes"], res["devices"], res["steps"]) == (2, 4, 3)
    _equals_one_device(runs, "2x2 data2 fsdp2, killed and resumed", wd)
    # one writer: process 0 prints the step lines, process 1 (which writes no results, metrics or
    # TensorBoard) none
    assert "step 3/3" in (wd / "logs" / "process_0.log").read_text()
    assert "step 3/3" not in (wd / "logs" / "process_1.log").read_text()


def test_stall_message_names_the_processes_behind_or_says_this_one_is():
    from grpo_jax.runtime.distributed import _stall_message

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
    from grpo_jax.runtime.distributed import Context

    ctx = Context()
    assert ctx.allgather_objects("x", {"a": 1}) == [{"a": 1}]
    assert ctx.broadcast_object("y", lambda: 3) == 3
    ctx.barrier("z")  # no-op with one process
    assert ctx.is_main and not ctx.multi
