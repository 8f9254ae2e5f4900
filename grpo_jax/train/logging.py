"""Host-side observability: TensorBoard (tensorboardX) + JSONL files + a console progress line.

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

`read_events` parses the event files back (tensorboardX has no reader), for tests and offline analysis.
Nothing here is used inside jit; metric values may be Python numbers, numpy or jax scalars.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import math
import os
import platform
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from grpo_jax import atomic

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


def git_info(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """{"git_sha": HEAD or None, "git_dirty": bool or None} of the git repository holding `path`.

    Default path: this package's directory (the code's revision, whatever the working directory)."""
    cwd = os.fspath(path) if path is not None else os.path.dirname(os.path.abspath(__file__))

    def git(*args):
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()

    try:
        sha = git("rev-parse", "HEAD") or None
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return {"git_sha": sha, "git_dirty": dirty}


def _environment() -> dict[str, Any]:
    import flax
    import jax

    try:
        import optax

        optax_version = optax.__version__
    except Exception:  # pragma: no cover - optax is a dependency
        optax_version = None
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax_version,
        "backend": jax.default_backend(),
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "devices": [str(d) for d in jax.devices()],
        "local_device_count": jax.local_device_count(),
    }


# -- MetricsLogger -------------------------------------------------------------------------------------------


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
            **_environment(),
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


def format_duration(seconds: float) -> str:
    """42s, 9m42s, 1h02m, 2d03h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


class Progress:
    """A console line: "step 12/200 (6%)  reward 0.312  SuccessRate 0.25  kl 0.0012  3.1 s/step  ETA 9m42s".

    Seconds per step are a moving average over the last `window` intervals between calls (each interval
    weighted by its number of steps). The first interval (from construction, usually including compilation)
    is used only until a second one exists. Metric names show their last "/" component; missing keys are
    skipped. `line` only builds the string (and records the timing); `show` also prints it with print_fn.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        print_fn: Callable[[str], Any] | None = print,
        *,
        window: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total_steps = int(total_steps)
        self.print_fn = print_fn
        self.clock = clock
        self._last = (int(start_step), clock())
        self._first: tuple[int, float] | None = None  # (steps, seconds) of the first interval
        self._intervals: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)

    def seconds_per_step(self) -> float | None:
        intervals = list(self._intervals) or ([self._first] if self._first else [])
        n = sum(k for k, _ in intervals)
        return sum(t for _, t in intervals) / n if n else None

    def line(self, step: int, metrics: Mapping[str, Any], keys: Sequence[str] = ()) -> str:
        step = int(step)
        now = self.clock()
        last_step, last_time = self._last
        if step > last_step:
            if self._first is None:
                self._first = (step - last_step, now - last_time)
            else:
                self._intervals.append((step - last_step, now - last_time))
            self._last = (step, now)
        pct = 100.0 * step / self.total_steps if self.total_steps else 100.0
        parts = [f"step {step}/{self.total_steps} ({pct:.0f}%)"]
        for k in keys:
            if k in metrics:
                parts.append(f"{k.rsplit('/', 1)[-1]} {float(np.asarray(metrics[k])):.3g}")
        sps = self.seconds_per_step()
        if sps is None:
            parts.append("-- s/step  ETA --")
        else:
            parts.append(f"{sps:.3g} s/step  ETA {format_duration(max(self.total_steps - step, 0) * sps)}")
        return "  ".join(parts)

    def show(self, step: int, metrics: Mapping[str, Any], keys: Sequence[str] = ()) -> str:
        """`line(...)`, printed with print_fn (if any); returns the line."""
        text = self.line(step, metrics, keys)
        if self.print_fn is not None:
            self.print_fn(text)
        return text


# -- per-problem pass rates ----------------------------------------------------------------------------------


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


def _event_files(path_or_dir: str | os.PathLike) -> list[str]:
    p = os.fspath(path_or_dir)
    if os.path.isfile(p):
        return [p]
    files = glob.glob(os.path.join(p, "**", "*tfevents*"), recursive=True)
    # file names start with events.out.tfevents.<unix time>: sort by that time so restarts come in order
    return sorted(files, key=lambda f: (_event_time(f), f))


def _event_time(f: str) -> float:
    try:
        return float(os.path.basename(f).split("tfevents.")[1].split(".")[0])
    except (IndexError, ValueError):
        return 0.0


def iter_events(path: str | os.PathLike) -> Iterator[Any]:
    """Yield `tensorboardX.proto.event_pb2.Event`s of one file (TFRecord framing; CRCs not checked).

    A truncated final record (a writer killed midway) ends the iteration."""
    from tensorboardX.proto import event_pb2

    with open(path, "rb") as f:
        while True:
            header = f.read(12)  # uint64 length + uint32 masked crc of the length
            if len(header) < 12:
                return
            (n,) = struct.unpack("<Q", header[:8])
            data = f.read(n)
            if len(data) < n or len(f.read(4)) < 4:  # payload + uint32 masked crc of the payload
                return
            ev = event_pb2.Event()
            ev.ParseFromString(data)
            yield ev


def _read(path_or_dir, pick) -> dict[str, list[tuple[int, Any]]]:
    out: dict[str, list[tuple[int, Any]]] = {}
    for f in _event_files(path_or_dir):
        for ev in iter_events(f):
            if ev.HasField("session_log") and ev.session_log.status == ev.session_log.START:
                # a restart with purge_step: TensorBoard hides earlier events at steps >= ev.step
                for tag in out:
                    out[tag] = [(s, v) for s, v in out[tag] if s < ev.step]
                continue
            if not ev.HasField("summary"):
                continue
            for val in ev.summary.value:
                got = pick(val)
                if got is not None:
                    out.setdefault(val.tag, []).append((int(ev.step), got))
    return out


def read_events(path_or_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Scalars in TensorBoard event files (one file or a directory searched recursively): {tag: [(step, v)]}.

    Files are read in creation order; a purge-step restart drops earlier values at steps >= it, like
    TensorBoard does."""

    def pick(val):
        if val.HasField("simple_value"):
            return float(val.simple_value)
        if val.HasField("tensor") and val.tensor.float_val and not val.tensor.string_val:
            return float(val.tensor.float_val[0])  # new-style scalars
        return None

    return _read(path_or_dir, pick)


def read_histograms(path_or_dir: str | os.PathLike) -> dict[str, list[tuple[int, dict]]]:
    """Histograms: {tag: [(step, {"min", "max", "num", "sum", "sum_squares", "bucket_limit", "bucket"})]}."""

    def pick(val):
        if not val.HasField("histo"):
            return None
        h = val.histo
        return {
            "min": h.min,
            "max": h.max,
            "num": h.num,
            "sum": h.sum,
            "sum_squares": h.sum_squares,
            "bucket_limit": list(h.bucket_limit),
            "bucket": list(h.bucket),
        }

    return _read(path_or_dir, pick)


def read_texts(path_or_dir: str | os.PathLike) -> dict[str, list[tuple[int, str]]]:
    """Text summaries: {tag: [(step, text)]} (tensorboardX appends "/text_summary" to the tag)."""

    def pick(val):
        if val.HasField("tensor") and val.tensor.string_val:
            return val.tensor.string_val[0].decode("utf-8")
        return None

    return _read(path_or_dir, pick)


class NullLogger:
    """The logger of processes other than 0 (they write nothing)."""

    def scalars(self, *a, **k) -> None: ...

    def histograms(self, *a, **k) -> None: ...

    def samples(self, *a, **k) -> None: ...

    def table(self, *a, **k) -> None: ...

    def close(self) -> None: ...


def final_table(results: dict) -> str:
    sft_r, grpo_r = results.get("sft", {}), results.get("grpo", {})
    keys = [k for k in sft_r if k.startswith("pass@") or k.endswith("/pass@1")]  # incl. mbpp/, humaneval/
    before = "after SFT" if "sft_seconds" in results or "sft_from" in results else "before GRPO"
    lines = ["", f"{'held-out metric':<24}{before:>12}{'after GRPO':>12}"]
    for k in keys:
        g = grpo_r.get(k)
        lines.append(f"{k:<24}{sft_r[k]:>12.3f}{(f'{g:.3f}' if g is not None else '-'):>12}")
    return "\n".join(lines)
