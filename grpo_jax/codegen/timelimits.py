"""Per-problem time limits from the reference solutions' measured run times (host side, no JAX).

Generated code loops forever often, and a program that never ends costs the whole wall limit. Like evalplus
and LiveCodeBench, each problem gets `limit = min(cap, max(floor, factor x reference seconds))`: the
reference solution is run once through the executor (its verdict's `seconds`: the whole program with its
tests, in the sandbox; for a stdin/stdout problem, whose every test is a run of its own under the limit, the
slowest test's seconds) and the figure is cached on disk, keyed by the program, its tests, its check and the
sandbox tier, so later runs do not measure again. `cap` is the executor's own limit (a per-problem limit is
never looser). A reference that does not pass keeps the cap (and is counted in the report).

    problems, report = with_reference_time_limits(executor, problems, floor_s=0.5, factor=5.0)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from grpo_jax import atomic
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.problem import Problem
from grpo_jax.sandbox import grading
from grpo_jax.sandbox.types import is_stdio

DEFAULT_FLOOR_S = 0.5
DEFAULT_FACTOR = 5.0


def cache_dir() -> Path:
    """grpo_jax's cache directory: $GRPO_JAX_CACHE_DIR, else ~/.cache/grpo_jax (also the compilation cache's
    parent, grpo_jax.runtime.compile_cache)."""
    return Path(os.environ.get("GRPO_JAX_CACHE_DIR") or Path.home() / ".cache" / "grpo_jax")


def cache_path() -> Path:
    """$GRPO_JAX_CACHE_DIR/reference_times.json (default ~/.cache/grpo_jax/reference_times.json)."""
    return cache_dir() / "reference_times.json"


def _key(p: Problem, tier: str) -> str:
    payload = json.dumps(
        [
            tier,
            p.reference,
            p.setup_code,
            p.child_check,
            # a stdin/stdout test's input is part of what runs (assert-style tests have none: their keys
            # are those of the caches written before stdin tests existed)
            [
                [t.call, t.kind, _stable_repr(t.expected), *([t.stdin] if t.stdin is not None else [])]
                for t in p.tests
            ],
            *([p.program_prelude] if p.program_prelude else []),
            # stdin/stdout: the slowest test's time, not the job's (keys of the whole-job figures differ)
            *(["per-test"] if _per_test(p) else []),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _stable_repr(x) -> str:
    """repr(x), the same in every process: a set's repr follows its items' hashes, which change with each
    process's string-hash seed (so an MBPP problem whose asserts compare sets was measured again by every run
    and added a cache entry each time); a value holding a set is written as the sandbox's cache tag
    (grading.tag: set items in sorted order), any other keeps its repr and so its key of older caches."""

    def has_set(v) -> bool:
        if isinstance(v, (set, frozenset)):
            return True
        if isinstance(v, dict):
            return any(has_set(k) or has_set(w) for k, w in v.items())
        return isinstance(v, (list, tuple)) and any(has_set(w) for w in v)

    if has_set(x):
        try:
            return json.dumps(grading.tag(x), sort_keys=True)
        except grading.BadResult:  # a value the sandbox cannot tag: its repr, as before
            pass
    return repr(x)


def _per_test(p: Problem) -> bool:
    """A stdin/stdout problem: each test is a separate sandboxed run with the problem's wall limit, so the
    limit comes from the slowest test's time (a whole-job figure would be N tests times too loose)."""
    return bool(p.tests) and is_stdio(p.tests)


def _seconds(p: Problem, v) -> float:
    if _per_test(p) and v.tests:
        return max(float(t.seconds) for t in v.tests)
    return float(v.seconds)


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(path: Path, data: dict) -> None:
    """Atomic write; a cache that cannot be written is only a cost (the figures are measured again)."""
    try:
        atomic.write_json(path, data, newline=False)
    except OSError:
        pass


def with_reference_time_limits(
    executor,
    problems: Sequence[Problem],
    *,
    floor_s: float = DEFAULT_FLOOR_S,
    factor: float = DEFAULT_FACTOR,
    cache: Path | None = None,
) -> tuple[list[Problem], dict]:
    """`problems` with `time_limit_s` set, and a report {measured, cached, no_reference, failed_reference,
    min_s, median_s, max_s}. The cap is the executor's wall limit."""
    if floor_s <= 0 or factor <= 0:
        raise ValueError(f"time limits need floor_s > 0 and factor > 0 (got {floor_s}, {factor})")
    cap = float(executor.limits.wall_s)
    path = cache or cache_path()
    store = _load(path)
    tier = str(getattr(executor, "tier", ""))
    keys = [_key(p, tier) for p in problems]
    todo = [i for i, (p, k) in enumerate(zip(problems, keys, strict=True)) if p.reference and k not in store]
    if todo:
        refs = [problems[i] for i in todo]
        # the reference as the whole program ("program" mode) or appended to the prompt ("append" mode)
        completions = [
            p.reference if p.completion_mode == "program" else p.reference[len(p.prompt) :] for p in refs
        ]
        plain = [dataclasses.replace(p, time_limit_s=None) for p in refs]
        verdicts = executor.run(jobs_for(plain, completions))
        for i, v in zip(todo, verdicts, strict=True):
            if v.status.value != "infra_error":
                store[keys[i]] = round(_seconds(problems[i], v), 6) if v.passed else None
        _save(path, store)
    out, limits = [], []
    failed = missing = 0
    for p, k in zip(problems, keys, strict=True):
        secs = store.get(k) if p.reference else None
        if not p.reference:
            missing += 1
        elif secs is None:
            failed += 1
        t = cap if secs is None else min(cap, max(float(floor_s), float(factor) * float(secs)))
        limits.append(t)
        out.append(dataclasses.replace(p, time_limit_s=t))
    s = sorted(limits)
    report = {
        "problems": len(problems),
        "measured": len(todo),
        "cached": len(problems) - len(todo) - missing,
        "no_reference": missing,
        "failed_reference": failed,
        "floor_s": floor_s,
        "factor": factor,
        "cap_s": cap,
        "min_s": s[0] if s else None,
        "median_s": s[len(s) // 2] if s else None,
        "max_s": s[-1] if s else None,
        "cache": str(path),
    }
    return out, report
