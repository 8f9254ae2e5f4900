"""Writing files and directories so that a reader never sees half of one (a neutral module: stdlib only).

    write_bytes(path, data)      write_text(path, text)      write_json(path, obj, indent=2)
    write_dir(out_dir, {name: text})

Every write goes to a temporary file in the target's own directory (same filesystem), is flushed and
fsync'ed, then renamed over the target (`os.replace`, atomic on POSIX), and the directory is fsync'ed so the
rename itself survives a power loss. On any error the temporary file is removed and the target is left as it
was. `write_dir` builds a whole directory beside `out_dir` the same way and renames it onto `out_dir`, which
must be missing or empty. One copy of this logic for the run's JSON files (run.json, results.json, the
checksums of a checkpoint), the evaluator's outputs and the on-disk caches.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import IO, Any

__all__ = ["fsync_dir", "write_bytes", "write_dir", "write_json", "write_text", "write_with"]


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory (its entries: a rename in it); a filesystem that cannot is let be."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_with(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """`write(f)` into a temporary binary file beside `path`, then fsync + rename over `path` + fsync of the
    directory; on any error the temporary file is removed and `path` is untouched."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(d)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    def write(f: IO[bytes]) -> None:
        f.write(data)

    write_with(path, write)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, *, newline: bool = True, **dump_kw: Any) -> None:
    """json.dumps(obj, **dump_kw) (+ a final newline) written atomically."""
    write_text(path, json.dumps(obj, **dump_kw) + ("\n" if newline else ""))


def write_dir(out_dir: str | os.PathLike, files: Mapping[str, str]) -> None:
    """Every file of `files` ({name: text}) in a temporary directory beside `out_dir`, each fsync'ed, renamed
    onto `out_dir` (missing or empty) when complete; on any error nothing is left."""
    out_dir = os.path.abspath(os.fspath(out_dir))
    parent = os.path.dirname(out_dir)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(out_dir)}-", dir=parent)
    try:
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(tmp)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(parent)
