"""TensorBoard event files read back (tensorboardX has no reader): scalars, histograms, texts, for tests and
offline analysis."""

from __future__ import annotations

import glob
import os
import struct
from collections.abc import Iterator
from typing import Any


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
