"""CodeI/O tasks (shipped in the ``reasoning-gym`` wheel) as call-tested program-synthesis `Problem`s.

The wheel's data files ``reasoning_gym/data/codeio.jsonl.gz`` (JSON lines) and ``codeio-hq.jsonl.gz`` (one
JSON array, despite its name) hold LLM-rewritten CodeI/O tasks: a ``task_description``, an
``input_output_spec``, a reference ``code_sample`` defining ``main_solution(**inputs)`` and an
``input_generator`` (``generate_input(s)(rng: Random) -> dict``). The files are read as data only: no module
of ``reasoning_gym`` is imported (its dependencies are not installed) and no task code runs in this process.

A problem here: the model sees the description, the spec, the signature of ``main_solution`` and one example,
and writes the whole program (completion_mode "program"); each test is ``main_solution(**{...})`` with a
generated input, graded by the parent against the reference's output (docs/data/CODEIO.md).

Building (once; cached on disk): every import must be standard library (an unused non-stdlib import is
removed); then, in the sandbox (`Executor.evaluate`: a child that never sees a candidate), the generator makes
inputs from ``Random(s)`` with per-(seed, task, index) seeds ``s``, twice, on two different zygotes (different
hash seeds and ``random`` states), and must give the same inputs both times; the reference runs on them twice,
on the two zygotes, and must give the same plain JSON outputs both times, for at least `MIN_TESTS` distinct
inputs; last, each finished problem's reference is graded like a candidate (`Executor.run`, all tests in one
job) and must pass. The rest are dropped and counted by reason (`REASONS`).

    problems = load_codeio("train")          # builds ~/.cache/grpo_jax/codeio/... the first time
    python -m experiments.build_codeio       # the same build, with progress and the survival report
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from grpo_jax import atomic
from grpo_jax.codegen.timelimits import cache_dir as _grpo_cache_dir
from grpo_jax.problem import Problem
from grpo_jax.sandbox import grading
from grpo_jax.sandbox.types import TestCase

__all__ = [
    "BUILDER_VERSION",
    "REASONS",
    "build_rows",
    "build_cache",
    "cache_path",
    "load_codeio",
    "problem_from_record",
    "source_rows",
    "split_of",
    "task_id_of",
]

BUILDER_VERSION = 1  # bump when anything below changes what a cache file holds
DEFAULT_SEED = 0
N_TESTS = 5  # tests per task
N_CANDIDATES = 10  # generator calls per task (duplicates and unusable inputs are skipped)
MIN_TESTS = 3  # fewer distinct usable tests: the task is dropped
MAX_CALL_CHARS = 10_000  # one test's call text (the input literal)
MAX_OUTPUT_CHARS = 10_000  # one expected value (its tagged JSON)
HELDOUT_BUCKETS = 10  # split: sha256("codeio-split:" + task_id) mod 10 == 0 -> "heldout" (~10%)
TEST_KIND = "json_eq"
FLOAT_TOL = 1e-6
DATA_FILES = ("codeio.jsonl.gz", "codeio-hq.jsonl.gz")
ENTRY = "main_solution"

# why a task is dropped (the first check it fails; a per-test problem drops the task when under MIN_TESTS
# tests are left, with the most common per-test reason)
REASONS = (
    "unparsable",  # code or generator is not Python, or defines no main_solution / generate_input(s)
    "non_stdlib_import",  # imports (and uses) a module outside sys.stdlib_module_names
    "generator_failed",  # the generator raised, timed out or returned no usable input dict
    "few_inputs",  # fewer than MIN_TESTS distinct usable inputs out of N_CANDIDATES generator calls
    "generator_nondeterministic",  # the generator, run again on another zygote, gives other inputs
    "reference_failed",  # the reference raised (or crashed) on too many inputs
    "reference_timeout",  # the reference did not finish within the executor's wall limit
    "output_not_plain",  # the output is not plain JSON data (sets, objects, NaN, non-str dict keys, ...)
    "too_large",  # an input literal or an output over MAX_CALL_CHARS / MAX_OUTPUT_CHARS
    "nondeterministic",  # the two reference runs (two zygotes) disagree
    "self_check_failed",  # the finished problem's reference does not pass its own tests through `run`
)


# ------------------------------------------------------------------------------------------------ the source
def data_dir() -> Path:
    """The wheel's data directory, located without importing reasoning_gym."""
    spec = importlib.util.find_spec("reasoning_gym")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the reasoning-gym wheel is not installed (pip install --no-deps reasoning-gym==0.1.25, "
            "requirements-nodeps.txt)"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "data"
        if all((p / f).is_file() for f in DATA_FILES):
            return p
    raise FileNotFoundError(f"reasoning_gym/data/{{{','.join(DATA_FILES)}}} not found in the wheel")


def wheel_version() -> str:
    try:
        return importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def task_id_of(code: str) -> str:
    """A task's id: the hash of its reference code (stable across row order and wheel versions)."""
    return "codeio/" + hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def split_of(task_id: str) -> str:
    """The fixed split: "heldout" where sha256("codeio-split:" + task_id) is 0 mod 10, else "train"."""
    h = int(hashlib.sha256(("codeio-split:" + task_id).encode()).hexdigest()[:8], 16)
    return "heldout" if h % HELDOUT_BUCKETS == 0 else "train"


def _read_rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):  # codeio-hq.jsonl.gz is one JSON array
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in rows if isinstance(r, dict)]


def source_rows(limit: int | None = None) -> list[dict]:
    """The wheel's tasks, deduplicated by reference code: codeio.jsonl.gz in file order, then the tasks of
    codeio-hq.jsonl.gz not already seen. Each row gains ``task_id``, ``index`` (its place in this order) and
    ``file``. `limit`: the first `limit` rows only."""
    d = data_dir()
    seen: set[str] = set()
    out: list[dict] = []
    for name in DATA_FILES:
        for r in _read_rows(d / name):
            code = r.get("code_sample")
            if not isinstance(code, str) or code in seen:
                continue
            seen.add(code)
            out.append(dict(r, task_id=task_id_of(code), index=len(out), file=name))
            if limit is not None and len(out) >= limit:
                return out
    return out


# ---------------------------------------------------------------------------------------- static analysis
def _imports(tree: ast.AST) -> list[tuple[ast.stmt, str, list[str]]]:
    """(statement, top-level module, names it binds) for every absolute import anywhere in `tree`."""
    out: list[tuple[ast.stmt, str, list[str]]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                out.append((n, a.name.split(".")[0], [a.asname or a.name.split(".")[0]]))
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            out.append((n, n.module.split(".")[0], [a.asname or a.name for a in n.names]))
    return out


def _names_used(trees: Sequence[ast.AST]) -> set[str]:
    used = set()
    for t in trees:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                used.add(n.id)
    return used


def _strip_lines(text: str, stmts: list[ast.stmt]) -> str:
    lines = text.splitlines(keepends=True)
    drop: set[int] = set()
    for s in stmts:
        drop.update(range(s.lineno - 1, (s.end_lineno or s.lineno)))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def clean_sources(code: str, gen: str) -> tuple[str, str, str, str] | tuple[None, str]:
    """Static checks (no code runs): ((code, gen, generator name, signature)) or (None, reason).

    A top-level import of a non-stdlib module whose names neither text uses (CodeI/O's habitual unused
    ``import numpy as np``) is removed; any other non-stdlib import drops the task."""
    try:
        with warnings.catch_warnings():  # the tasks' own invalid escapes ("\w" in a str) are theirs
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            trees = [ast.parse(code), ast.parse(gen)]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, "unparsable"
    main = [n for n in trees[0].body if isinstance(n, ast.FunctionDef) and n.name == ENTRY]
    gens = [
        n for n in trees[1].body if isinstance(n, ast.FunctionDef) and n.name.startswith("generate_input")
    ]
    if not main or not gens:
        return None, "unparsable"
    used = _names_used(trees)
    texts = [code, gen]
    for k, tree in enumerate(trees):
        strip = []
        for stmt, mod, names in _imports(tree):
            if mod in sys.stdlib_module_names or mod == "__future__":
                continue
            unused = stmt in tree.body and "*" not in names and not (set(names) & used)
            others = [m for s, m, _ in _imports(tree) if s is stmt and m in sys.stdlib_module_names]
            if not unused or others:
                return None, "non_stdlib_import"
            strip.append(stmt)
        if strip:
            texts[k] = _strip_lines(texts[k], strip)
    signature = f"def {ENTRY}({ast.unparse(main[-1].args)}):"
    return texts[0], texts[1], gens[0].name, signature


# ----------------------------------------------------------------------------------------------- plain data
def _literal(value) -> str | None:
    """The Python literal of a generated input dict, or None when it has none that evaluates back to it."""
    if type(value) is not dict or not all(type(k) is str and k.isidentifier() for k in value):
        return None
    try:
        text = repr(value)
        if len(text) > MAX_CALL_CHARS:
            return "too_large"
        back = ast.literal_eval(text)
        return text if grading.tag(back) == grading.tag(value) else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, grading.BadResult):
        return None


def _plain_json(v, depth: int = 0) -> bool:
    """JSON data: None, bool, int, finite float, str, list / tuple, dict with str keys (nested <= 100)."""
    if depth > grading.MAX_DEPTH:
        return False
    t = type(v)
    if v is None or t in (bool, int, str):
        return True
    if t is float:
        return math.isfinite(v)
    if t in (list, tuple):
        return all(_plain_json(x, depth + 1) for x in v)
    if t is dict:
        return all(type(k) is str and _plain_json(x, depth + 1) for k, x in v.items())
    return False


def _reason_of(answer: tuple[bool, object] | None) -> str:
    """A reference call's failed answer from `Executor.evaluate` (None: no answer at all) as a drop reason."""
    if answer is None:
        return "reference_failed"  # crashed (memory, signal) without a record
    why = str(answer[1])
    if "time limit" in why:
        return "reference_timeout"
    if "not plain data" in why:
        return "output_not_plain"
    return "reference_failed"


def _evaluate_all(executor, prelude: str, exprs: list[str], slot: int) -> dict[str, tuple[bool, object]]:
    """All answers: one child for the batch, then one child per unanswered expression (a slow or crashing
    one stops the batch); after the first single expression that times out, the rest count as timed out."""
    got = dict(executor.evaluate(prelude, exprs, slot=slot))
    for i, e in enumerate(exprs):
        if e in got:
            continue
        got.update(executor.evaluate(prelude, [e], slot=slot))
        if e in got and not got[e][0] and "time limit" in str(got[e][1]):
            for rest in exprs[i + 1 :]:
                got.setdefault(rest, got[e])
            break
    return got


# ------------------------------------------------------------------------------------------------ building
def seeds_for(task_id: str, seed: int, n: int = N_CANDIDATES) -> list[int]:
    """The generator seeds of one task: deterministic per (build seed, task, candidate index)."""
    return [
        int(hashlib.sha256(f"codeio:{seed}:{task_id}:{i}".encode()).hexdigest()[:12], 16) for i in range(n)
    ]


def _generator_prelude(code: str, gen: str, gen_name: str) -> str:
    return (
        "import random as _codeio_random\nfrom random import Random\n\n"
        + code
        + "\n\n"
        + gen
        + "\n\n\ndef _codeio_inputs(seed):\n"
        + "    _codeio_random.seed(seed)\n"
        + f"    return {gen_name}(Random(seed))\n"
    )


def build_task(row: dict, executor, seed: int = DEFAULT_SEED, slots: tuple[int, int] = (0, 1)) -> dict:
    """One task -> {"task_id", "kept": True, ...record} or {"task_id", "kept": False, "reason", "detail"}.

    Everything the task's code does runs in the sandbox through `executor.evaluate` (the generator and the
    first reference run on zygote ``slots[0]``, the second reference run on ``slots[1]``)."""
    tid = row.get("task_id") or task_id_of(str(row.get("code_sample", "")))
    code, gen = row.get("code_sample"), row.get("input_generator")
    if not isinstance(code, str) or not isinstance(gen, str):
        return {"task_id": tid, "kept": False, "reason": "unparsable", "detail": "missing code or generator"}
    cleaned = clean_sources(code, gen)
    if cleaned[0] is None:
        return {"task_id": tid, "kept": False, "reason": cleaned[1], "detail": ""}
    code, gen, gen_name, signature = cleaned

    def drop(reason: str, detail: str = "") -> dict:
        return {"task_id": tid, "kept": False, "reason": reason, "detail": detail[:200]}

    # 1. inputs, from the generator (sandboxed)
    exprs = [f"_codeio_inputs({s})" for s in seeds_for(tid, seed)]
    prelude = _generator_prelude(code, gen, gen_name)
    answers = _evaluate_all(executor, prelude, exprs, slots[0])
    calls: list[str] = []
    used: list[str] = []  # the generator calls behind `calls`
    why: collections.Counter[str] = collections.Counter()
    for e in exprs:
        a = answers.get(e)
        if a is None or not a[0]:
            why["generator_failed"] += 1
            continue
        lit = _literal(a[1])
        if lit is None:
            why["generator_failed"] += 1
        elif lit == "too_large":
            why["too_large"] += 1
        elif (call := f"{ENTRY}(**{lit})") in calls:
            why["few_inputs"] += 1  # a duplicate
        else:
            calls.append(call)
            used.append(e)
        if len(calls) == N_TESTS:
            break
    if len(calls) < MIN_TESTS:
        return drop(why.most_common(1)[0][0], f"{len(calls)} distinct usable inputs: {dict(why)}")
    # the same seeds on another zygote must give the same inputs (not so with set order, clocks, `secrets`)
    again = _evaluate_all(executor, prelude, used, slots[1])
    for e, c in zip(used, calls, strict=True):
        a = again.get(e)
        if a is None or not a[0] or f"{ENTRY}(**{_literal(a[1])})" != c:
            return drop("generator_nondeterministic", f"{e}: the second run gave other inputs")

    # 2. expected outputs, from the reference (sandboxed), on one zygote
    first = _evaluate_all(executor, code, calls, slots[0])
    kept: list[tuple[str, object]] = []
    why = collections.Counter()
    for c in calls:
        a = first.get(c)
        if a is None or not a[0]:
            why[_reason_of(a)] += 1
        elif not _plain_json(a[1]):
            why["output_not_plain"] += 1
        elif len(json.dumps(grading.tag(a[1]))) > MAX_OUTPUT_CHARS:
            why["too_large"] += 1
        else:
            kept.append((c, a[1]))
    if len(kept) < MIN_TESTS:
        return drop(why.most_common(1)[0][0], f"{len(kept)} usable outputs: {dict(why)}")

    # 3. determinism: the same calls, in the same order, on another zygote
    again = _evaluate_all(executor, code, [c for c, _ in kept], slots[1])
    final = []
    for c, v in kept:
        a = again.get(c)
        if a is None or not a[0]:
            if a is not None and _reason_of(a) != "reference_timeout":
                return drop("nondeterministic", f"{c[:80]}: the second run failed: {a[1]}")
            why[_reason_of(a)] += 1
            continue
        if json.dumps(grading.tag(a[1])) != json.dumps(grading.tag(v)):
            return drop("nondeterministic", f"{c[:80]}: two runs gave different values")
        final.append((c, v))
    if len(final) < MIN_TESTS:
        return drop(why.most_common(1)[0][0], f"{len(final)} tests left after the second run: {dict(why)}")
    return {
        "task_id": tid,
        "kept": True,
        "index": row.get("index"),
        "file": row.get("file", ""),
        "difficulty": row.get("difficulty"),
        "description": str(row.get("task_description", "")),
        "io_spec": str(row.get("input_output_spec", "")),
        "signature": signature,
        "reference": code,
        "split": split_of(tid),
        "tests": [{"call": c, "expected": grading.tag(v)} for c, v in final],
    }


def _self_check(executor, records: list[dict]) -> None:
    """The finished problems, graded end to end: each reference runs as a candidate would (one job, all its
    tests, `Executor.run`, the executor's wall limit for the whole job). A reference that does not pass drops
    its task (in place: ``kept`` False, the reason); one that passes records its run time."""
    if not records:
        return
    from grpo_jax.codegen.jobs import jobs_for

    problems = [problem_from_record(r) for r in records]
    verdicts = executor.run(jobs_for(problems, [p.reference for p in problems]))
    for r, v in zip(records, verdicts, strict=True):
        if v.passed:
            r["reference_seconds"] = round(v.seconds, 4)
            continue
        reason = "reference_timeout" if v.status.value == "timeout" else "self_check_failed"
        detail = f"{v.status.value}: {v.detail} {[t.error for t in v.tests if not t.passed][:2]}"
        r.update(kept=False, reason=reason, detail=detail[:200])


def _fmt_s(s: float) -> str:
    s = int(max(0.0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def build_rows(
    rows: Sequence[dict],
    executor,
    seed: int = DEFAULT_SEED,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
    every_s: float = 10.0,
) -> tuple[list[dict], dict]:
    """Build every row (threads: `workers`, each on its own pair of zygote slots), then self-check the kept
    ones. Returns (the kept records in row order, the report: tasks, kept, counts per drop reason, seconds,
    the dropped task ids by reason and a short detail per dropped task)."""
    n_slots = int(getattr(executor, "num_workers", 1) or 1)
    workers = max(1, min(int(workers or max(1, n_slots // 2)), max(1, n_slots // 2), len(rows) or 1))
    results: list[dict | None] = [None] * len(rows)
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "kept": 0}
    last = time.monotonic()  # of the last progress line
    t0 = time.monotonic()

    def worker(w: int) -> None:
        nonlocal last
        slots = (2 * w, 2 * w + 1) if n_slots >= 2 else (0, 0)
        while True:
            with lock:
                i = state["next"]
                state["next"] += 1
            if i >= len(rows):
                return
            try:
                res = build_task(rows[i], executor, seed, slots)
            except Exception as e:  # a bug here must not lose the build: the task counts as failed
                res = {
                    "task_id": rows[i].get("task_id", "?"),
                    "kept": False,
                    "reason": "reference_failed",
                    "detail": f"builder: {type(e).__name__}: {e}"[:200],
                }
            with lock:
                results[i] = res
                state["done"] += 1
                state["kept"] += bool(res["kept"])
                now = time.monotonic()
                if progress and (now - last >= every_s or state["done"] == len(rows)):
                    last = now
                    done, el = state["done"], now - t0
                    eta = el / done * (len(rows) - done)
                    progress(
                        f"codeio build: {done}/{len(rows)} tasks ({100 * done / len(rows):.1f}%), "
                        f"kept {state['kept']}, {done / el:.2f} tasks/s, elapsed {_fmt_s(el)}, "
                        f"ETA {_fmt_s(eta)}"
                    )

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    survivors = [r for r in results if r is not None and r["kept"]]
    if progress:
        progress(
            f"codeio build: self-check of {len(survivors)} problems (each reference graded as a candidate)"
        )
    _self_check(executor, survivors)
    kept = [r for r in results if r is not None and r["kept"]]
    dropped = collections.Counter(r["reason"] for r in results if r is not None and not r["kept"])
    report = {
        "tasks": len(rows),
        "kept": len(kept),
        "dropped": {k: dropped.get(k, 0) for k in REASONS},
        "kept_by_split": dict(collections.Counter(r["split"] for r in kept)),
        "tests": sum(len(r["tests"]) for r in kept),
        "seconds": round(time.monotonic() - t0, 1),
        "workers": workers,
        "dropped_tasks": {
            k: [r["task_id"] for r in results if r is not None and not r["kept"] and r["reason"] == k]
            for k in REASONS
        },
        "dropped_detail": {
            r["task_id"]: r.get("detail", "") for r in results if r is not None and not r["kept"]
        },
    }
    return kept, report


# ---------------------------------------------------------------------------------------------------- cache
def default_cache_dir() -> Path:
    """$GRPO_JAX_CACHE_DIR/codeio, else ~/.cache/grpo_jax/codeio."""
    return _grpo_cache_dir() / "codeio"


def cache_path(
    cache_dir: str | Path | None = None, seed: int = DEFAULT_SEED, limit: int | None = None
) -> Path:
    """The cache file of one build: keyed by the wheel's version, BUILDER_VERSION, the seed and the limit."""
    d = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    tail = f"-first{limit}" if limit is not None else ""
    return d / f"codeio-rg{wheel_version()}-b{BUILDER_VERSION}-seed{seed}-t{N_TESTS}{tail}.jsonl.gz"


def _write_cache(path: Path, header: dict, records: list[dict]) -> None:
    def write(raw) -> None:
        with gzip.open(raw, "wt", encoding="utf-8") as f:  # closes the gzip stream, not `raw`
            f.write(json.dumps(dict(header, kind="header"), sort_keys=True) + "\n")
            for r in records:
                f.write(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n")

    atomic.write_with(path, write)


def read_cache(path: str | Path) -> tuple[dict, list[dict]]:
    """(header with the survival report, kept task records) of one cache file."""
    header: dict = {}
    records = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("kind") == "header":
                header = r
            else:
                records.append(r)
    return header, records


def build_cache(
    cache_dir: str | Path | None = None,
    seed: int = DEFAULT_SEED,
    limit: int | None = None,
    executor=None,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
) -> Path:
    """Build the cache file for (wheel, builder, seed, limit) unless it exists (or `force`); its path.
    Without an `executor`, one with 2 x `workers` slots (default 2 workers) is made and closed here."""
    path = cache_path(cache_dir, seed, limit)
    if path.is_file() and not force:
        return path
    rows = source_rows(limit)
    own = executor is None
    if own:
        from grpo_jax.sandbox.executor import Executor

        executor = Executor(num_workers=2 * (workers or 2))
    try:
        records, report = build_rows(rows, executor, seed=seed, workers=workers, progress=progress)
        tier = getattr(executor, "tier", "")
    finally:
        if own:
            executor.close()
    header = dict(
        report,
        builder_version=BUILDER_VERSION,
        wheel="reasoning-gym",
        wheel_version=wheel_version(),
        seed=seed,
        limit=limit,
        n_tests=N_TESTS,
        min_tests=MIN_TESTS,
        sandbox_tier=tier,
        python=sys.version.split()[0],
    )
    _write_cache(path, header, records)
    return path


# ------------------------------------------------------------------------------------------------- problems
INSTRUCTION = (
    "Write a complete Python program that defines the function `main_solution` of the starter code. It is "
    "called as `main_solution(...)` with each test's inputs as keyword arguments, and its return value is "
    "checked: return the output described above as plain data (numbers, strings, booleans, None, lists, and "
    "dicts with string keys). Use only the Python standard library."
)
MAX_EXAMPLE_CHARS = 2000  # a longer example is not shown (the problem then has no public test)


def example_text(call: str, expected) -> str:
    """``>>> main_solution(a=1, b=[2])`` then the expected value as a Python literal (tuples as lists)."""
    kwargs = ast.literal_eval(call[len(ENTRY) + 3 : -1])  # the builder wrote it: f"{ENTRY}(**{literal})"
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f">>> {ENTRY}({args})\n{grading.json_lists(expected)!r}"


def prompt_of(rec: dict, example: str | None = None) -> str:
    """The plain-text user message: description, the input/output spec, the example, the starter code (the
    reference's signature) and the instruction."""
    parts = [
        rec["description"].strip(),
        "The input and output requirements are as follows:\n\n" + rec["io_spec"].strip(),
    ]
    if example is not None:
        parts.append("Example:\n\n" + example)
    parts.append(f"Starter code:\n```python\n{rec['signature']}\n```")
    parts.append(INSTRUCTION)
    return "\n\n".join(parts) + "\n"


def problem_from_record(rec: dict) -> Problem:
    """A cached record as a `Problem`: call tests ``main_solution(**{...})`` of kind "json_eq" (tuples and
    lists alike, bool is not int, floats within FLOAT_TOL absolute). The shortest test is the prompt's example
    and the one public test; `tests` holds all of them, the public one first (`graded_public`), so
    ``with_grade_tests("private")`` grades on the others."""
    tests = []
    for t in rec["tests"]:
        v = grading.json_lists(grading.untag(t["expected"]))
        tests.append(
            TestCase(
                call=t["call"],
                expected=v,
                kind=TEST_KIND,
                float_tol=FLOAT_TOL,
                source=f"assert {t['call'][:200]} == {json.dumps(v)[:200]}",
            )
        )
    shown = min(range(len(tests)), key=lambda i: len(tests[i].call) + len(json.dumps(tests[i].expected)))
    example = example_text(tests[shown].call, tests[shown].expected)
    public: tuple[TestCase, ...] = ()
    if len(example) <= MAX_EXAMPLE_CHARS:
        public = (tests[shown],)
        tests = [tests[shown]] + tests[:shown] + tests[shown + 1 :]
    kwargs = dict(
        task_id=rec["task_id"],
        prompt=prompt_of(rec, example if public else None),
        entry_point=ENTRY,
        reference=rec["reference"],
        tests=tuple(tests),
        completion_mode="program",
        split=rec["split"],
        source="codeio",
        description=rec["description"],
        test_kind="call",
        public_tests=public,
        graded_public=bool(public),
        starter_code=rec["signature"] + "\n",
    )
    names = {f.name for f in dataclasses.fields(Problem)}  # tolerate a Problem without the newer fields
    return Problem(**{k: v for k, v in kwargs.items() if k in names})


def load_codeio(
    split: str = "train",
    cache_dir: str | Path | None = None,
    limit: int | None = None,
    executor=None,
    seed: int = DEFAULT_SEED,
    workers: int | None = None,
) -> list[Problem]:
    """The CodeI/O problems of `split` ("train" | "heldout" | "all"), built into the cache on first use.

    `limit`: consider the first `limit` source tasks only (a full cache, when present, is filtered; else a
    cache of those tasks is built). Building runs the tasks' code in the sandbox (`executor`, or one made
    here) and prints its progress to stderr."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"unknown CodeI/O split {split!r}; valid: train, heldout, all")
    full = cache_path(cache_dir, seed, None)
    if full.is_file() or limit is None:
        path = build_cache(cache_dir, seed, None, executor, workers, _stderr)
    else:
        path = build_cache(cache_dir, seed, limit, executor, workers, _stderr)
    _, records = read_cache(path)
    if limit is not None:
        records = [r for r in records if r.get("index") is not None and r["index"] < limit]
    return [problem_from_record(r) for r in records if split == "all" or r["split"] == split]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
