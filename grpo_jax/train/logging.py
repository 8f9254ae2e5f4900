"""The run's log writer: TensorBoard (tensorboardX) + JSONL files + run.json.

Files under `workdir`:
  run.json            run metadata, written atomically (temp + rename): run_info (config...), git SHA
                      and dirty flag, start time, host, python / jax / flax / optax versions, devices. On a
                      restart in the same workdir the earlier start times are kept in "previous_starts".
  tb/                 TensorBoard event files; tags are the metric names exactly ("Policy/Entropy", ...).
  metrics.jsonl       one line per `scalars` call: {"step": int, "time": unix seconds, **metrics}.
                      Values are floats; non-finite ones are written as the STRINGS "nan", "inf", "-inf"
                      (strict JSON has no NaN; `float(v)` reads either form back).
  samples.jsonl       one line per sample row: {"step": ..., **row} (prompt, completion, status, reward...).
  {name}.jsonl        one line per `table` call: {"step": ..., "time": ..., "rows": [...]}.

The other concerns of a run's observability have their own modules: run_info.py (git, host, versions),
console.py (the step line, the final table), pass_rates.py (per-problem pass rates), events.py (the event
files read back: tensorboardX has no reader). Nothing here is used inside jit; metric values may be Python
numbers, numpy or jax scalars.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_jax import atomic
from grpo_jax.train.run_info import environment, git_info

# -- small helpers -------------------------------------------------------------------------------------------


def _to_jsonable(x: Any) -> Any:
    """Config dataclasses, numpy / jax scalars and arrays, tuples, paths -> plain JSON values."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _to_jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, Mapping):
        return {str(k): _to_jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [_to_jsonable(v) for v in x]
    if isinstance(x, float):
        return _json_float(x)
    if isinstance(x, bool | int | str) or x is None:
        return x
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # numpy / jax arrays and scalars
        a = np.asarray(x)
        if a.ndim == 0:
            v = a.item()
            return _json_float(v) if isinstance(v, float) else v
        return [_to_jsonable(v) for v in a.tolist()]
    return str(x)


def _json_float(v: float) -> float | str:
    """A finite float, or "nan" / "inf" / "-inf" (strict JSON has no non-finite numbers)."""
    v = float(v)
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _dumps(obj: Any) -> str:
    return json.dumps(_to_jsonable(obj), allow_nan=False, ensure_ascii=False)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """JSON (indent 2, no NaN, UTF-8) to `path` atomically (grpo_jax.atomic): never a half-written file."""
    atomic.write_json(path, _to_jsonable(obj), indent=2, allow_nan=False, ensure_ascii=False)


def _drop_lines_from_step(path: str, purge_step: int) -> None:
    """Rewrite a JSONL file without the lines whose "step" is >= purge_step (temp file + rename)."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                step = json.loads(line).get("step")
            except ValueError:
                continue  # a line cut by a crash
            if isinstance(step, int) and step >= purge_step:
                continue
            kept.append(line if line.endswith("\n") else line + "\n")
    atomic.write_text(path, "".join(kept))


class MetricsLogger:
    """Writes scalars / histograms / samples / tables to TensorBoard and JSONL files under `workdir`.

    Appends to existing JSONL files, so a resumed run continues the same files. `purge_step` (the restored
    step, on resume) makes TensorBoard hide events of the crashed run at steps >= it (and `read_events`
    does the same), and drops the lines with step >= purge_step from the step-indexed JSONL files
    (metrics.jsonl, samples.jsonl), rewritten atomically, so each step appears once.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        run_info: dict,
        enable_tensorboard: bool = True,
        purge_step: int | None = None,
        max_text_samples: int = 4,
    ):
        self.workdir = os.path.abspath(os.fspath(workdir))
        os.makedirs(self.workdir, exist_ok=True)
        self.max_text_samples = max_text_samples
        self.start_time = time.time()
        info: dict[str, Any] = {
            **_to_jsonable(dict(run_info)),
            **git_info(),
            "start_time": self.start_time,
            "start_time_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.start_time)),
            **environment(),
        }
        run_path = os.path.join(self.workdir, "run.json")
        if os.path.exists(run_path):  # a restart in the same workdir: remember the earlier starts
            try:
                with open(run_path, encoding="utf-8") as f:
                    old = json.load(f)
                info["previous_starts"] = list(old.get("previous_starts", [])) + [old.get("start_time")]
            except (OSError, ValueError):
                pass
        self.run_info = info
        write_json_atomic(run_path, info)
        if purge_step is not None:
            for name in ("metrics.jsonl", "samples.jsonl"):
                _drop_lines_from_step(os.path.join(self.workdir, name), int(purge_step))
        self._files: dict[str, Any] = {}
        self._tb = None
        self._tb_error: OSError | None = None  # the error that stopped the TensorBoard writer thread
        if enable_tensorboard:
            from tensorboardX import SummaryWriter

            # tensorboardX names files by the second (events.out.tfevents.<sec>.<host>) and a second writer in
            # the same second would overwrite the first: a nanosecond suffix keeps restarts apart and in order
            self._tb = SummaryWriter(
                logdir=os.path.join(self.workdir, "tb"),
                purge_step=purge_step,
                filename_suffix=f".{time.time_ns()}",
            )
            self._keep_tb_write_errors(self._tb)

    def _keep_tb_write_errors(self, writer: Any) -> None:
        """tensorboardX writes events in a thread that a write error (a full disk) ends with a traceback,
        after which its bounded queue fills and the next event blocks the run forever: the error is kept
        instead (later events are dropped) and raised by the next call of this logger (_check_tb)."""
        events = writer._get_file_writer().event_writer._ev_writer

        def keep(method):
            def call(*args):
                if self._tb_error is None:
                    try:
                        return method(*args)
                    except OSError as e:
                        self._tb_error = e

            return call

        events.write_event = keep(events.write_event)
        events.flush = keep(events.flush)

    def _check_tb(self) -> None:
        if self._tb_error is not None:
            e = self._tb_error
            raise OSError(e.errno, e.strerror, os.path.join(self.workdir, "tb")) from e

    def _append(self, name: str, line: str) -> None:
        self._check_tb()
        f = self._files.get(name)
        if f is None:
            # line-buffered: a killed run loses no line it logged
            f = self._files[name] = open(os.path.join(self.workdir, name), "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        try:
            f.write(line + "\n")
        except OSError as e:  # a full disk: name the file (the write's own error does not)
            raise OSError(e.errno, e.strerror, f.name) from e

    def scalars(self, step: int, metrics: Mapping[str, Any]) -> None:
        """TensorBoard scalars with exactly these tags + one line in metrics.jsonl."""
        step = int(step)
        values = {str(k): float(np.asarray(v)) for k, v in metrics.items()}
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
        self._append("metrics.jsonl", _dumps({"step": step, "time": time.time(), **values}))

    def histograms(self, step: int, arrays: Mapping[str, Any]) -> None:
        """TensorBoard histograms (non-finite entries are dropped; an empty array is skipped)."""
        if self._tb is None:
            return
        self._check_tb()
        for k, v in arrays.items():
            a = np.asarray(v, dtype=np.float64).reshape(-1)
            a = a[np.isfinite(a)]
            if a.size:
                self._tb.add_histogram(str(k), a, int(step))

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append rows to samples.jsonl and show the first `max_text_samples` as TensorBoard text."""
        step = int(step)
        for row in rows:
            self._append("samples.jsonl", _dumps({"step": step, **row}))
        if self._tb is not None and rows:
            parts = []
            for i, row in enumerate(rows[: self.max_text_samples]):
                fields = "\n\n".join(
                    f"**{k}**:\n\n    " + str(v).replace("\n", "\n    ") for k, v in row.items()
                )
                parts.append(f"### sample {i}\n\n{fields}")
            self._tb.add_text("samples", "\n\n---\n\n".join(parts), step)

    def table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """One line in workdir/{name}.jsonl: {"step", "time", "rows": [...]}."""
        if not name or os.sep in name or name.startswith("."):
            raise ValueError(
                f"MetricsLogger.table name={name!r}: must be a plain file stem like 'pass_rates'"
            )
        self._append(f"{name}.jsonl", _dumps({"step": int(step), "time": time.time(), "rows": list(rows)}))

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()
        if self._tb is not None:
            self._tb.flush()
            self._check_tb()

    def close(self) -> None:
        """Flush and close every file; a write error (a full disk) is raised once all are closed, so no file
        object is left to fail again when it is garbage-collected."""
        errors = []
        for f in self._files.values():
            try:
                f.close()  # flushes; the file is closed even when that fails
            except OSError as e:
                errors.append(OSError(e.errno, e.strerror, f.name))
        self._files.clear()
        if self._tb is not None:
            tb, self._tb = self._tb, None
            try:
                tb.close()
                self._check_tb()
            except OSError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- console progress ----------------------------------------------------------------------------------------


class NullLogger:
    """The logger of processes other than 0 (they write nothing)."""

    def scalars(self, *a, **k) -> None: ...

    def histograms(self, *a, **k) -> None: ...

    def samples(self, *a, **k) -> None: ...

    def table(self, *a, **k) -> None: ...

    def close(self) -> None: ...
