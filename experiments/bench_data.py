"""Reading a large dataset file in bounded memory (issue 43): writes a parquet file of CodeContests-layout
problems of the size asked (default 2 GB; one row group, as pyarrow writes a table by default, which is the
hardest case for a reader), then reads the first N problems with grpo_jax.data.load in a fresh process and
prints its peak RSS, and the same for a process that only imports grpo_jax.data (the baseline).

    python -m experiments.bench_data                       # 2 GB, --max_problems=1000
    python -m experiments.bench_data --gb=0.2 --problems=100 --row_group_rows=0

Each figure is one JSON line: file_gb, rows, row_groups, write_s, read_s, problems, peak_rss_mb (the reading
process), baseline_rss_mb (the import alone). The file is deleted at the end (--keep to keep it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

flags.DEFINE_float("gb", 2.0, "size of the generated parquet file, GB")
flags.DEFINE_integer("problems", 1000, "--max_problems of the read")
flags.DEFINE_integer("row_group_rows", 0, "rows per row group (0: pyarrow's default, one group here)")
flags.DEFINE_string("dir", None, "where to write the file (default: a temporary directory)")
flags.DEFINE_bool("keep", False, "keep the generated file")
FLAGS = flags.FLAGS

ROW_TEST_BYTES = 20_000  # each row's generated tests: about this many bytes (random printable ASCII)

# peak RSS from /proc/self/status VmHWM: the high-water mark of this process's own address space (getrusage's
# ru_maxrss survives fork + exec, so it would report the writer's memory)
_READ = """
import json, sys, time
from grpo_jax import data
t = time.perf_counter()
problems = data.load(sys.argv[1], max_problems=int(sys.argv[2])) if sys.argv[2] != "0" else []
dt = time.perf_counter() - t
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(json.dumps({"problems": len(problems), "read_s": round(dt, 2), "peak_rss_mb": round(hwm / 1024, 1)}))
"""


def write(path: str, gb: float, row_group_rows: int) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    rows = max(1, int(gb * 1e9 / ROW_TEST_BYTES))
    n_tests, per = 10, ROW_TEST_BYTES // 20
    schema = pa.schema(
        [
            ("name", pa.string()),
            ("description", pa.string()),
            (
                "public_tests",
                pa.struct([("input", pa.list_(pa.string())), ("output", pa.list_(pa.string()))]),
            ),
            (
                "private_tests",
                pa.struct([("input", pa.list_(pa.string())), ("output", pa.list_(pa.string()))]),
            ),
            (
                "generated_tests",
                pa.struct([("input", pa.list_(pa.string())), ("output", pa.list_(pa.string()))]),
            ),
            ("difficulty", pa.int64()),
        ]
    )
    t0 = time.perf_counter()
    chunk = 1000
    kw = {"row_group_size": row_group_rows} if row_group_rows else {}
    # one row group unless asked: the writer holds the table's batches and writes them as one table
    writer = pq.ParquetWriter(path, schema) if row_group_rows else None
    tables = []
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        digits = rng.integers(33, 127, size=(n, n_tests, 2, per), dtype=np.uint8)  # printable ASCII
        gen = [
            {
                "input": [d[t, 0].tobytes().decode() for t in range(n_tests)],
                "output": [d[t, 1].tobytes().decode() for t in range(n_tests)],
            }
            for d in digits
        ]
        small = {"input": ["1\n"], "output": ["1\n"]}
        batch = pa.table(
            {
                "name": [f"big/{start + i}" for i in range(n)],
                "description": ["Print the input."] * n,
                "public_tests": [small] * n,
                "private_tests": [small] * n,
                "generated_tests": gen,
                "difficulty": [(start + i) % 7 for i in range(n)],
            },
            schema=schema,
        )
        if writer is not None:
            writer.write_table(batch, **kw)
        else:
            tables.append(batch)
        print(f"writing: {min(start + chunk, rows)}/{rows} rows", file=sys.stderr, flush=True)
    if writer is not None:
        writer.close()
    else:
        pq.write_table(pa.concat_tables(tables), path, row_group_size=rows)
        del tables
    meta = pq.ParquetFile(path).metadata
    return {
        "file_gb": round(os.path.getsize(path) / 1e9, 3),
        "rows": rows,
        "row_groups": meta.num_row_groups,
        "write_s": round(time.perf_counter() - t0, 1),
    }


def read(path: str, n: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _READ, path, str(n)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv):
    del argv
    d = FLAGS.dir or tempfile.mkdtemp(prefix="bench_data_")
    path = os.path.join(d, "big.parquet")
    try:
        info = write(path, FLAGS.gb, FLAGS.row_group_rows)
        print(json.dumps({"figure": "file", **info}), flush=True)
        base = read(path, 0)
        got = read(path, FLAGS.problems)
        print(
            json.dumps({"figure": "read", **got, "baseline_rss_mb": base["peak_rss_mb"], **info}), flush=True
        )
    finally:
        if not FLAGS.keep and os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    app.run(main)
