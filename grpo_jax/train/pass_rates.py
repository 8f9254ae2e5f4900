"""Per-problem attempts, passes and ever-solved over a run (PassRateTable, pass_rates.jsonl)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_jax.train.logging import _to_jsonable


class PassRateTable:
    """Attempts and passes per task (and per level when given); JSON-able for checkpoints."""

    def __init__(self) -> None:
        self._tasks: dict[str, dict[str, Any]] = {}

    def update(
        self, task_ids: Sequence[str], passed: Sequence[bool], levels: Sequence[Any] | None = None
    ) -> None:
        """One entry per attempt (a task id may repeat, e.g. G samples of one problem)."""
        task_ids = [str(t) for t in task_ids]
        passed = [bool(p) for p in np.asarray(passed).reshape(-1)]
        if len(passed) != len(task_ids):
            raise ValueError(
                f"PassRateTable.update: {len(task_ids)} task_ids but {len(passed)} passed values"
            )
        if levels is not None:
            levels = list(levels)
            if len(levels) != len(task_ids):
                raise ValueError(f"PassRateTable.update: {len(task_ids)} task_ids but {len(levels)} levels")
        for i, (t, p) in enumerate(zip(task_ids, passed, strict=True)):
            e = self._tasks.setdefault(t, {"attempts": 0, "passes": 0, "level": None})
            e["attempts"] += 1
            e["passes"] += int(p)
            if levels is not None:
                e["level"] = _to_jsonable(levels[i])

    @classmethod
    def from_counts(cls, task_ids: Sequence[str], attempts, passes, levels: Sequence[Any] | None = None):
        """A table from per-task counts (e.g. the rollout state's ProblemStats); tasks never attempted are
        left out."""
        t = cls()
        att, pas = np.asarray(attempts).reshape(-1), np.asarray(passes).reshape(-1)
        for i, task in enumerate(task_ids):
            if att[i] > 0:
                t._tasks[str(task)] = {
                    "attempts": int(att[i]),
                    "passes": int(pas[i]),
                    "level": None if levels is None else _to_jsonable(levels[i]),
                }
        return t

    def rows(self, top: int | None = None) -> list[dict]:
        """Sorted by pass rate (highest first), then attempts (most first), then task id."""
        out = []
        for t, e in self._tasks.items():
            row = {
                "task_id": t,
                "attempts": e["attempts"],
                "passes": e["passes"],
                "pass_rate": e["passes"] / e["attempts"] if e["attempts"] else 0.0,
                "ever_solved": e["passes"] > 0,
            }
            if e["level"] is not None:
                row["level"] = e["level"]
            out.append(row)
        out.sort(key=lambda r: (-r["pass_rate"], -r["attempts"], r["task_id"]))
        return out if top is None else out[:top]

    def level_rows(self) -> list[dict]:
        """Per level: n_problems, attempts, passes, pass_rate (pooled), mean_problem_pass_rate."""
        by: dict[Any, list[dict]] = {}
        for e in self._tasks.values():
            if e["level"] is not None:
                by.setdefault(e["level"], []).append(e)
        out = []
        for lvl in sorted(by, key=lambda x: (str(type(x)), x)):
            es = by[lvl]
            att, pas = sum(e["attempts"] for e in es), sum(e["passes"] for e in es)
            out.append(
                {
                    "level": lvl,
                    "n_problems": len(es),
                    "attempts": att,
                    "passes": pas,
                    "pass_rate": pas / att if att else 0.0,
                    "mean_problem_pass_rate": float(np.mean([e["passes"] / e["attempts"] for e in es])),
                }
            )
        return out

    def summary(self) -> dict[str, float]:
        """n_problems_seen, n_ever_solved, mean_pass_rate (mean of the per-problem pass rates; 0 if none)."""
        rates = [e["passes"] / e["attempts"] for e in self._tasks.values() if e["attempts"]]
        return {
            "n_problems_seen": len(self._tasks),
            "n_ever_solved": sum(e["passes"] > 0 for e in self._tasks.values()),
            "mean_pass_rate": float(np.mean(rates)) if rates else 0.0,
        }

    def state_dict(self) -> dict:
        return {"tasks": {t: dict(e) for t, e in self._tasks.items()}}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        tasks = {}
        for t, e in dict(d.get("tasks", {})).items():
            tasks[str(t)] = {
                "attempts": int(e["attempts"]),
                "passes": int(e["passes"]),
                "level": e.get("level"),
            }
        self._tasks = tasks

    def __len__(self) -> int:
        return len(self._tasks)


# -- reading event files back --------------------------------------------------------------------------------
