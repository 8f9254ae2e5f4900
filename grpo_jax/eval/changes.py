"""`python -m grpo_jax.eval.changes BEFORE.jsonl AFTER.jsonl`: which tasks two evaluations disagree on.

BEFORE and AFTER are per-task files (experiments.evaluate's per_task.jsonl, or the main job's
WORKDIR/eval/step_<N>/<set>_per_task.jsonl: step 0 is after SFT, the last step after GRPO); it prints the
tasks gained (passed after, not before) and lost, and how many passed in both and in neither
(grpo_jax.eval.results.task_changes). `--key` picks the column (default greedy_passed), `--json` prints
the result as one JSON object. A bad file is one `error:` line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from grpo_jax.eval.results import task_changes


def read_rows(path: str) -> list[dict]:
    """The rows of a JSON-lines file (blank lines skipped); ValueError names the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e})") from None
            if not isinstance(row, dict) or "task_id" not in row:
                raise ValueError(f"{path}:{i}: not a per-task row (no task_id)")
            rows.append(row)
    return rows


def report(changes: dict, key: str) -> str:
    """The printed summary of task_changes' result."""
    ids = lambda xs: " ".join(map(str, xs)) or "-"  # noqa: E731
    n = len(changes["gained"]) + len(changes["lost"]) + changes["both"] + changes["neither"]
    return (
        f"gained ({len(changes['gained'])}): {ids(changes['gained'])}\n"
        f"lost ({len(changes['lost'])}): {ids(changes['lost'])}\n"
        f"both {changes['both']}, neither {changes['neither']} ({n} tasks, by {key})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_jax.eval.changes",
        description="The tasks gained and lost between two per-task files (BEFORE, AFTER).",
    )
    parser.add_argument("before", help="per-task JSON lines of the earlier evaluation")
    parser.add_argument("after", help="per-task JSON lines of the later evaluation")
    parser.add_argument("--key", default="greedy_passed", help="the column that says passed")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    try:
        changes = task_changes(read_rows(args.before), read_rows(args.after), key=args.key)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(changes) if args.json else report(changes, args.key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
