"""Rows from the files datasets are kept in: JSON Lines (.jsonl, .jsonl.gz), a JSON list (.json, .json.gz),
parquet (one file, a directory of shards, or a glob), Arrow IPC files, and a `datasets` `save_to_disk`
directory (Arrow files + dataset_info.json / state.json). Everything is read as a stream, a batch of rows at a
time, so a file of any size is read in bounded memory and a caller that needs N problems stops after them.

    src = open_source("data/train-*.parquet")
    src.fields                 # the column names (parquet / Arrow: from the schema, before any row is read)
    for where, index, row in src.rows(columns=("name", "description", ...)):
        ...                    # row: a dict (nested structs as dicts, lists as lists) or a DatasetError

`where` names the row for errors: "PATH:LINE" (JSON Lines), "PATH:item N" (a JSON list), "PATH: row group G,
row R" (parquet, both from 0), "PATH: batch B, row R" (Arrow). `index` counts rows from 0 over every shard.

Dataset files are untrusted input. They are read with pyarrow (pinned in requirements.txt), whose releases
before 14.0.1 could run code from a file's Arrow extension type metadata (CVE-2023-47248, the pickled
`arrow.py_extension_type`); the pinned release has no Python extension type left to load, and nothing here
registers one, so an extension column reads as its storage type (tests/test_data_formats.py checks a file
that names a pickle payload). JSON is parsed by the stdlib; nothing is unpickled here.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from grpo_jax.data.common import DatasetError

BATCH_ROWS = 64  # rows per Arrow batch: bounds the memory of a read to a few rows' data
_GLOB = set("*?[")
CONTAINERS = (
    ".jsonl / .jsonl.gz (one JSON object a line), .json / .json.gz (a JSON list of objects), .parquet (a "
    "file, a directory of shards or a glob), .arrow, or a `datasets` save_to_disk directory"
)

Row = tuple[str, int, "dict | DatasetError"]


class Source:
    """One input (a file, a set of shards or a save_to_disk directory). `fields`: the column names when the
    container has a schema (parquet, Arrow), else None (JSON: the first row's fields decide)."""

    def __init__(self, path: str, kind: str, files: Sequence[Path]):
        self.path, self.kind, self.files = path, kind, list(files)
        self.fields: set[str] | None = None
        if kind in ("parquet", "arrow"):
            self.fields = set()
            for f in self.files:
                self.fields |= set(_schema(f, kind).names)

    def rows(self, columns: Sequence[str] | None = None) -> Iterator[Row]:
        """Every row in order. `columns`: read only these (columnar files; missing ones are simply absent)."""
        index = 0
        for f in self.files:
            if self.kind == "json":
                it = _json_rows(f)
            elif self.kind == "parquet":
                it = _parquet_rows(f, columns)
            else:
                it = _arrow_rows(f, columns)
            for where, row in it:
                yield where, index, row
                index += 1


def open_source(path: str | Path) -> Source:
    """The Source of a path (see the module docstring); DatasetError for a path that is none of them."""
    p = str(path)
    if not os.path.exists(p) and _GLOB & set(p):
        files = sorted(Path(x) for x in glob.glob(p, recursive=True) if os.path.isfile(x))
        if not files:
            raise DatasetError(p, "path", "the glob matches no file", CONTAINERS)
        kinds = {_file_kind(f) for f in files}
        if len(kinds) > 1 or kinds & {"json"} and len(files) > 1:
            raise DatasetError(
                p, "path", "the glob matches files of different kinds", "parquet or Arrow shards"
            )
        return Source(p, kinds.pop(), files)
    if os.path.isdir(p):
        return _directory(Path(p))
    if not os.path.isfile(p):
        raise FileNotFoundError(f"{p}: no such file or directory")
    return Source(p, _file_kind(Path(p)), [Path(p)])


def _file_kind(f: Path) -> str:
    name = f.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".arrow"):
        return "arrow"
    return "json"


def _directory(d: Path) -> Source:
    """A save_to_disk directory (state.json names its Arrow files; dataset_info.json alone: every .arrow file
    in it), a DatasetDict's (refused: name a split), or a directory of parquet (else Arrow) shards."""
    if (d / "dataset_dict.json").is_file():
        try:
            splits = json.loads((d / "dataset_dict.json").read_text()).get("splits", [])
        except (OSError, ValueError, AttributeError):
            splits = []
        raise DatasetError(
            str(d),
            "path",
            "a DatasetDict directory" + (f" (splits: {', '.join(map(str, splits))})" if splits else ""),
            f"one split's directory, e.g. {d / (str(splits[0]) if splits else 'train')}",
        )
    state = d / "state.json"
    if state.is_file():
        try:
            names = [x["filename"] for x in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DatasetError(
                str(state), "_data_files", f"unreadable ({type(e).__name__}: {e})", "datasets' state.json"
            ) from None
        files = [d / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise DatasetError(
                str(d), "_data_files", f"missing {', '.join(missing)}", "the Arrow files it names"
            )
        return Source(str(d), "arrow", files)
    parquet = sorted(f for f in d.rglob("*.parquet") if f.is_file())
    if parquet:
        return Source(str(d), "parquet", parquet)
    arrow = sorted(f for f in d.rglob("*.arrow") if f.is_file())
    if arrow:
        return Source(str(d), "arrow", arrow)
    raise DatasetError(
        str(d), "path", "a directory with no .parquet / .arrow file and no state.json", CONTAINERS
    )


# ------------------------------------------------------------------------------------------------------------
# JSON
# ------------------------------------------------------------------------------------------------------------
def _json_rows(path: Path) -> Iterator[tuple[str, dict | DatasetError]]:
    """(where, row) per problem of a .jsonl / .jsonl.gz file (blank lines skipped) or of a file whose first
    non-blank character is "[" (a JSON list); a row that is not a JSON object comes as a DatasetError."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            first = True
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if first and line.lstrip().startswith("["):
                    yield from _json_list(path, line + f.read(), lineno)
                    return
                first = False
                where = f"{path}:{lineno}"
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as e:
                    msg = (
                        f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else "too deep"
                    )
                    row = DatasetError(where, "line", f"not JSON ({msg})", "one JSON object a line")
                else:
                    if not isinstance(row, dict):
                        row = DatasetError(
                            where, "line", f"a JSON {type(row).__name__}", "one JSON object a line"
                        )
                yield where, row
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DatasetError(
            str(path), "file", f"unreadable ({type(e).__name__}: {e})", "UTF-8 JSONL"
        ) from None


def _json_list(path: Path, text: str, first_line: int) -> Iterator[tuple[str, dict | DatasetError]]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        where = f"{path}:{first_line + e.lineno - 1}"
        raise DatasetError(where, "file", f"not JSON ({e.msg})", "a JSON list of objects, or JSONL") from None
    if not isinstance(rows, list):
        raise DatasetError(
            f"{path}:{first_line}", "file", "not a JSON list", "a JSON list of objects, or JSONL"
        )
    for i, row in enumerate(rows):
        where = f"{path}:item {i + 1}"
        if not isinstance(row, dict):
            yield where, DatasetError(where, "item", f"a JSON {type(row).__name__}", "a JSON object")
        else:
            yield where, row


# ------------------------------------------------------------------------------------------------------------
# Parquet and Arrow
# ------------------------------------------------------------------------------------------------------------
def _unreadable(f: Path, kind: str, e: Exception, where: str | None = None) -> DatasetError:
    msg = " ".join(str(e).split())[:300] or type(e).__name__
    valid = "a parquet file (as pyarrow writes it)" if kind == "parquet" else "an Arrow IPC file or stream"
    return DatasetError(where or str(f), "file", f"unreadable {kind} ({type(e).__name__}: {msg})", valid)


def _schema(f: Path, kind: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            return pq.ParquetFile(f).schema_arrow
        with _open_ipc(f) as reader:
            return reader.schema
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _unreadable(f, kind, e) from None


def _parquet_rows(f: Path, columns: Sequence[str] | None) -> Iterator[tuple[str, dict | DatasetError]]:
    """A row group at a time, BATCH_ROWS rows a batch (pre_buffer off, a small read buffer: memory stays a few
    rows' worth whatever the file's size)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f, buffer_size=1 << 20, pre_buffer=False)
        names = set(pf.schema_arrow.names)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _unreadable(f, "parquet", e) from None
    cols = None if columns is None else [c for c in columns if c in names]
    for g in range(pf.num_row_groups):
        r = 0
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=cols):
                for row in batch.to_pylist():
                    yield f"{f}: row group {g}, row {r}", row
                    r += 1
        except (pa.ArrowException, OSError, ValueError) as e:
            raise _unreadable(f, "parquet", e, f"{f}: row group {g}, row {r}") from None


class _open_ipc:
    """An Arrow IPC stream (what `datasets` writes) or file, memory-mapped."""

    def __init__(self, f: Path):
        import pyarrow as pa

        self.source = pa.memory_map(str(f), "r")
        try:
            self.reader = pa.ipc.open_stream(self.source)
        except pa.ArrowInvalid:
            self.source.seek(0)
            self.reader = pa.ipc.open_file(self.source)

    def __enter__(self):
        return self.reader

    def __exit__(self, *exc):
        self.source.close()


def _arrow_rows(f: Path, columns: Sequence[str] | None) -> Iterator[tuple[str, dict | DatasetError]]:
    import pyarrow as pa

    b = r = 0
    try:
        with _open_ipc(f) as reader:
            names = set(reader.schema.names)
            cols = None if columns is None else [c for c in columns if c in names]
            batches = (
                (reader.get_batch(i) for i in range(reader.num_record_batches))
                if isinstance(reader, pa.ipc.RecordBatchFileReader)
                else reader
            )
            for b, batch in enumerate(batches):
                if cols is not None:
                    batch = batch.select(cols)
                for start in range(0, batch.num_rows, BATCH_ROWS):
                    for r, row in enumerate(batch.slice(start, BATCH_ROWS).to_pylist(), start):
                        yield f"{f}: batch {b}, row {r}", row
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _unreadable(f, "Arrow", e, f"{f}: batch {b}, row {r}") from None
