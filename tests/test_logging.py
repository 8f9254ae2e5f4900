"""MetricsLogger (TensorBoard + JSONL + run.json), read_events, Progress ETA, PassRateTable."""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import OptimConfig
from grpo_jax.runtime.memory import memory_metrics
from grpo_jax.train.console import Progress, format_duration
from grpo_jax.train.events import read_events, read_histograms, read_texts
from grpo_jax.train.logging import MetricsLogger
from grpo_jax.train.pass_rates import PassRateTable


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_scalars_roundtrip_tags_and_jsonl(tmp_path):
    logger = MetricsLogger(tmp_path, run_info={"config": OptimConfig(), "name": "t"})
    logger.scalars(
        1, {"Policy/Entropy": 1.5, "Training/AdvantageNorm": np.float32(0.25), "kl": jnp.float32(2.0)}
    )
    logger.scalars(2, {"Policy/Entropy": 1.25, "Performance/SuccessRate": 0.5, "reward": float("nan")})
    logger.scalars(3, {"reward": float("inf"), "loss": -float("inf"), "tokens": 7})
    logger.close()

    ev = read_events(tmp_path / "tb")
    assert ev["Policy/Entropy"] == [(1, 1.5), (2, 1.25)]
    assert ev["Training/AdvantageNorm"] == [(1, 0.25)]
    assert ev["Performance/SuccessRate"] == [(2, 0.5)]
    assert ev["kl"] == [(1, 2.0)]
    assert ev["tokens"] == [(3, 7.0)]
    assert math.isnan(ev["reward"][0][1]) and ev["reward"][1] == (3, math.inf)
    assert set(ev) == {
        "Policy/Entropy",
        "Training/AdvantageNorm",
        "Performance/SuccessRate",
        "kl",
        "reward",
        "loss",
        "tokens",
    }

    lines = read_jsonl(tmp_path / "metrics.jsonl")  # strict JSON: json.loads would accept NaN, so check text
    assert (
        "NaN" not in (tmp_path / "metrics.jsonl").read_text()
        and "Infinity" not in (tmp_path / "metrics.jsonl").read_text()
    )
    assert [ln["step"] for ln in lines] == [1, 2, 3]
    assert all(isinstance(ln["time"], float) for ln in lines)
    assert lines[0]["Policy/Entropy"] == 1.5 and lines[0]["Training/AdvantageNorm"] == 0.25
    assert lines[1]["reward"] == "nan"  # non-finite values are the strings "nan" / "inf" / "-inf"
    assert lines[2]["reward"] == "inf" and lines[2]["loss"] == "-inf" and lines[2]["tokens"] == 7.0
    assert math.isnan(float(lines[1]["reward"]))


def test_run_json(tmp_path):
    MetricsLogger(tmp_path, run_info={"config": OptimConfig(learning_rate=0.5), "tag": ("a", 1)}).close()
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["config"]["learning_rate"] == 0.5 and info["config"]["grad_clip"] == 1.0
    assert info["tag"] == ["a", 1]
    assert "git_sha" in info and (info["git_sha"] is None or len(info["git_sha"]) == 40)
    assert info["jax"] == jax.__version__ and info["flax"]
    assert info["devices"] == [str(d) for d in jax.devices()]
    assert abs(info["start_time"] - __import__("time").time()) < 60
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no temp file left behind
    # a restart in the same workdir keeps the earlier start
    MetricsLogger(tmp_path, run_info={}, enable_tensorboard=False).close()
    info2 = json.loads((tmp_path / "run.json").read_text())
    assert info2["previous_starts"] == [info["start_time"]]


def test_histograms_samples_tables(tmp_path):
    with MetricsLogger(tmp_path, run_info={}) as logger:
        logger.histograms(5, {"advantages": np.array([-1.0, 0.0, 1.0, np.nan]), "rewards": jnp.ones((2, 3))})
        logger.histograms(5, {"empty": np.zeros((0,))})  # skipped, no error
        rows = [
            {"prompt": "def f(x):", "completion": "    return x\n", "status": "pass", "reward": 1.0},
            {"prompt": "def g():", "completion": "  oops", "status": "syntax_error", "reward": float("nan")},
        ]
        logger.samples(5, rows)
        logger.table(5, "pass_rates", [{"task_id": "a", "pass_rate": 0.5}])
        logger.table(6, "pass_rates", [])
        with pytest.raises(ValueError, match="plain file stem"):
            logger.table(6, "../x", [])
    h = read_histograms(tmp_path / "tb")
    assert set(h) == {"advantages", "rewards"}
    ((step, adv),) = h["advantages"]
    assert step == 5 and adv["num"] == 3 and adv["min"] == -1.0 and adv["max"] == 1.0 and adv["sum"] == 0.0
    assert h["rewards"][0][1]["num"] == 6 and h["rewards"][0][1]["sum_squares"] == 6.0
    texts = read_texts(tmp_path / "tb")
    ((step, text),) = texts["samples/text_summary"]
    assert step == 5 and "return x" in text and "syntax_error" in text
    assert read_events(tmp_path / "tb") == {}  # no histogram / text leaks into the scalars

    s = read_jsonl(tmp_path / "samples.jsonl")
    assert s[0] == {"step": 5, **rows[0]}
    assert s[1]["status"] == "syntax_error" and s[1]["reward"] == "nan"
    t = read_jsonl(tmp_path / "pass_rates.jsonl")
    assert [x["step"] for x in t] == [5, 6] and t[0]["rows"] == [{"task_id": "a", "pass_rate": 0.5}]


def test_purge_step_on_resume(tmp_path):
    with MetricsLogger(tmp_path, run_info={}) as logger:
        for s in (1, 2, 3, 4):
            logger.scalars(s, {"x": float(s)})
    # crashed after step 4, resumed from a checkpoint at step 2: steps 3, 4 are redone
    with MetricsLogger(tmp_path, run_info={}, purge_step=3) as logger:
        for s in (3, 4):
            logger.scalars(s, {"x": 10.0 * s})
    assert read_events(tmp_path)["x"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    # the JSONL lines of the redone steps are replaced, so each step appears once
    assert [(ln["step"], ln["x"]) for ln in read_jsonl(tmp_path / "metrics.jsonl")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 30.0),
        (4, 40.0),
    ]


def test_read_events_single_file_and_truncated(tmp_path):
    with MetricsLogger(tmp_path, run_info={}) as logger:
        logger.scalars(1, {"a/b": 1.0})
        logger.scalars(2, {"a/b": 2.0})
    (f,) = [os.path.join(tmp_path / "tb", n) for n in os.listdir(tmp_path / "tb")]
    assert read_events(f) == {"a/b": [(1, 1.0), (2, 2.0)]}
    with open(f, "rb+") as fh:  # a writer killed midway: the last record is cut short
        fh.truncate(os.path.getsize(f) - 3)
    assert read_events(f) == {"a/b": [(1, 1.0)]}


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_progress_eta_with_injected_clock():
    clock = FakeClock()
    printed = []
    p = Progress(200, start_step=0, print_fn=printed.append, clock=clock, window=2)
    clock.t += 40.0  # first interval: 10 steps incl. compilation, 4 s/step
    line = p.show(
        10,
        {"reward": 0.3125, "Performance/SuccessRate": 0.25, "kl": 0.0012},
        ["reward", "Performance/SuccessRate", "kl", "missing"],
    )
    assert line == "step 10/200 (5%)  reward 0.312  SuccessRate 0.25  kl 0.0012  4 s/step  ETA 12m40s"
    assert printed == [line]  # show() prints, line() does not
    clock.t += 10.0  # 10 steps at 1 s/step: the first (compile) interval no longer counts
    assert p.line(20, {}, []) == "step 20/200 (10%)  1 s/step  ETA 3m00s"
    clock.t += 60.0  # 20 steps at 3 s/step; moving average over (10 steps, 10 s), (20 steps, 60 s)
    assert p.line(40, {}, []) == "step 40/200 (20%)  2.33 s/step  ETA 6m13s"
    clock.t += 5.0  # 5 steps at 1 s/step; window=2 drops the (10, 10 s) interval: 65 s / 25 steps = 2.6
    assert p.line(45, {}, []) == "step 45/200 (22%)  2.6 s/step  ETA 6m43s"
    assert p.line(45, {}, []).endswith("2.6 s/step  ETA 6m43s")  # same step again: no new interval
    assert len(printed) == 1


def test_progress_without_rate_and_resume():
    clock = FakeClock()
    p = Progress(100, start_step=50, print_fn=None, clock=clock)
    assert p.line(50, {"x": 1.0}, ["x"]) == "step 50/100 (50%)  x 1  -- s/step  ETA --"
    clock.t += 25.0
    assert p.line(75, {}, []) == "step 75/100 (75%)  1 s/step  ETA 25s"


def test_format_duration():
    assert [format_duration(s) for s in (0, 42.4, 60, 582, 3720, 90061)] == [
        "0s",
        "42s",
        "1m00s",
        "9m42s",
        "1h02m",
        "1d01h",
    ]


def test_pass_rate_table():
    t = PassRateTable()
    t.update(["a", "a", "b", "c"], [True, False, False, True], levels=[1, 1, 2, 2])
    t.update(["a", "b"], np.array([True, False]), levels=[1, 2])
    t.update(["d"], [False])
    assert t.rows() == [
        {"task_id": "c", "attempts": 1, "passes": 1, "pass_rate": 1.0, "ever_solved": True, "level": 2},
        {"task_id": "a", "attempts": 3, "passes": 2, "pass_rate": 2 / 3, "ever_solved": True, "level": 1},
        {"task_id": "b", "attempts": 2, "passes": 0, "pass_rate": 0.0, "ever_solved": False, "level": 2},
        {"task_id": "d", "attempts": 1, "passes": 0, "pass_rate": 0.0, "ever_solved": False},
    ]
    assert [r["task_id"] for r in t.rows(top=2)] == ["c", "a"]
    assert t.summary() == {"n_problems_seen": 4, "n_ever_solved": 2, "mean_pass_rate": (1 + 2 / 3) / 4}
    assert t.level_rows() == [
        {
            "level": 1,
            "n_problems": 1,
            "attempts": 3,
            "passes": 2,
            "pass_rate": 2 / 3,
            "mean_problem_pass_rate": 2 / 3,
        },
        {
            "level": 2,
            "n_problems": 2,
            "attempts": 3,
            "passes": 1,
            "pass_rate": 1 / 3,
            "mean_problem_pass_rate": 0.5,
        },
    ]
    # JSON round-trip, as in a checkpoint's host dict
    t2 = PassRateTable()
    t2.load_state_dict(json.loads(json.dumps(t.state_dict())))
    assert t2.rows() == t.rows() and t2.summary() == t.summary() and len(t2) == 4
    with pytest.raises(ValueError, match="2 task_ids but 1 passed"):
        t.update(["a", "b"], [True])
    assert PassRateTable().summary() == {"n_problems_seen": 0, "n_ever_solved": 0, "mean_pass_rate": 0.0}


def test_memory_metrics_host_peak_and_device_allocator_peak():
    class Dev:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    import resource

    host = memory_metrics(devices=[])  # CPU-like: no device figure at all
    assert set(host) == {"memory/host_peak_rss_mb"}
    # ru_maxrss is KiB on Linux: the figure is it / 1024 (read right after, the peak cannot have fallen)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 >= host["memory/host_peak_rss_mb"] > 10
    # accelerators: the largest allocator peak over the devices, in MiB; a device without the key is skipped
    devs = [Dev({"peak_bytes_in_use": 3 * 2**20}), Dev(None), Dev({"peak_bytes_in_use": 5 * 2**20 + 2**19})]
    assert memory_metrics(devices=devs)["memory/device_peak_mb"] == 5.5
    assert "memory/device_peak_mb" not in memory_metrics(devices=[Dev({}), Dev(None)])
