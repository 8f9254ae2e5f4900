"""Build the CodeI/O problem cache (grpo_jax.codegen.codeio) and print its survival report.

    python -m experiments.build_codeio [--limit=N] [--workers=2] [--seed=0] [--cache_dir=DIR] [--force]

Runs every task's input generator and reference solution in the sandbox (a child per run; two zygote slots
per worker), prints progress with an ETA to stderr, writes the versioned cache file (default
$GRPO_JAX_CACHE_DIR/codeio or ~/.cache/grpo_jax/codeio) and prints how many tasks survive and why the others
were dropped. With the cache already there it only prints the report (--force rebuilds).
"""

from __future__ import annotations

import json
import sys
import time

from absl import app, flags

from grpo_jax.codegen import codeio

FLAGS = flags.FLAGS
flags.DEFINE_integer("limit", None, "the first N source tasks only (default: all)")
flags.DEFINE_integer("workers", 2, "worker threads (each drives two sandbox zygotes)")
flags.DEFINE_integer("seed", codeio.DEFAULT_SEED, "the build seed (input generator seeds derive from it)")
flags.DEFINE_string("cache_dir", None, "cache directory (default $GRPO_JAX_CACHE_DIR/codeio)")
flags.DEFINE_bool("force", False, "rebuild even when the cache file exists")
flags.DEFINE_bool("json", False, "print the report as one JSON object instead of a table")


def report_lines(header: dict, path) -> list[str]:
    n, kept = header["tasks"], header["kept"]
    out = [
        f"CodeI/O from reasoning-gym {header['wheel_version']} (builder v{header['builder_version']}, "
        f"seed {header['seed']}, limit {header['limit']}): {path}",
        f"tasks {n}, kept {kept} ({100 * kept / max(n, 1):.1f}%), tests {header['tests']}, "
        f"split {header['kept_by_split']}",
        f"build: {header['seconds']:.0f} s, {header['workers']} worker(s), "
        f"sandbox tier {header['sandbox_tier']}, python {header['python']}",
        "dropped:",
    ]
    for reason in codeio.REASONS:
        c = header["dropped"].get(reason, 0)
        out.append(f"  {reason:<27} {c:>5}  ({100 * c / max(n, 1):.1f}%)")
    return out


def main(argv):
    del argv
    t0 = time.monotonic()
    path = codeio.build_cache(
        cache_dir=FLAGS.cache_dir,
        seed=FLAGS.seed,
        limit=FLAGS.limit,
        workers=FLAGS.workers,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
        force=FLAGS.force,
    )
    header, _ = codeio.read_cache(path)
    if FLAGS.json:
        print(json.dumps({k: v for k, v in header.items() if k not in ("dropped_tasks", "dropped_detail")}))
    else:
        print("\n".join(report_lines(header, path)))
        print(f"(this command: {time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    app.run(main)
