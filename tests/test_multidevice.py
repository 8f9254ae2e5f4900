"""Data- and model-parallel train steps equal the single-device step (8 forced CPU devices, own process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sharded_train_step_equals_single_device():
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests/scripts/multidevice_check.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["devices"] == 8
    assert res["param_moved"] > 1e-4  # the steps really changed the parameters
    assert res["dp_param_diff"] <= 1e-6, res
    assert res["mp_param_diff"] <= 1e-6, res
    assert res["dp_metric_diff"] <= 1e-6, res
    assert res["mp_metric_diff"] <= 1e-6, res
    assert res["mp_q_proj_spec"] == [None, None, "model"]
