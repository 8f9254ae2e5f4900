"""Acyclic layers: the import graph of grpo_jax follows the table below, and "no JAX" modules import no JAX.

* `test_layer_rule`: every `import` / `from ... import` in every .py file under grpo_jax/ (at top level and
  inside functions; relative imports resolved) is checked against `RULES`. Only grpo_jax targets are ruled on.
* `test_no_jax`: each module whose docstring promises no JAX (and every module of the host-side packages) is
  imported in a fresh interpreter, which must not have loaded JAX afterwards.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "grpo_jax"

ONLY = "may import only"  # every grpo_jax import of these files must lie under one of the modules listed
NEVER = "must not import"  # no grpo_jax import of these files may lie under any of the modules listed


class Rule(NamedTuple):
    files: str | tuple[str, ...]  # fnmatch pattern(s) of paths under grpo_jax/
    kind: str  # ONLY | NEVER
    modules: tuple[str, ...]  # grpo_jax.<name> (a module and everything below it)
    unless: tuple[str, ...] = ()  # fnmatch patterns of paths under grpo_jax/ that the rule does not cover


# neutral modules: policies may import them; they import nothing of grpo_jax but each other
NEUTRAL = ("types", "rng", "errors", "atomic")

# fmt: off
RULES = {
    # rule id    files under grpo_jax/  kind  grpo_jax.<modules>
    "core":      Rule("core/*",     ONLY,  ("core", "errors")),
    "policies":  Rule("policies/*", ONLY,  ("core", "policies", *NEUTRAL)),
    "sandbox":   Rule("sandbox/*",  ONLY,  ("sandbox",)),
    "pretrained": Rule("pretrained/*", ONLY, ("core", "policies", "pretrained", "tokenization", *NEUTRAL)),
    "tokenization": Rule("tokenization/*", ONLY, ("tokenization",)),
    "algorithms": Rule("algorithms/*", ONLY, ("algorithms", "core", "config", *NEUTRAL)),
    "problem":   Rule("problem.py", ONLY,  ("sandbox.types",)),
    "codegen":   Rule("codegen/*",  NEVER, ("train", "policies", "core", "pool", "config")),
    "envs":      Rule("envs/*",     NEVER, ("train", "config")),
    "train-top": Rule("*",          NEVER, ("train",), unless=("train/*", "__init__.py")),
    "runtime":   Rule("runtime/*",  ONLY,  ("runtime", "codegen", *NEUTRAL)),
    "rollout":   Rule("rollout/*",  NEVER, ("train", "eval")),
    "eval":      Rule("eval/*",     NEVER, ("train",)),
    "rewards":   Rule("rewards/*",  ONLY,  ("rewards", "codegen", "problem", "sandbox", "errors")),
    "neutral":   Rule(tuple(f"{m}.py" for m in NEUTRAL), ONLY, NEUTRAL),
}
# fmt: on

# Host-side packages: every module in them is checked for JAX, whatever its docstring says.
NO_JAX_PACKAGES = ("grpo_jax.sandbox", "grpo_jax.codegen", "grpo_jax.tokenization", "grpo_jax.rewards")
NO_JAX_MODULES = ("grpo_jax.problem",)
# A docstring that says one of these about its own module is a promise this test holds it to.
NO_JAX_CLAIM = re.compile(r"\bno JAX\b|never imports? (?:grpo_jax or )?jax\b|without JAX", re.IGNORECASE)
JAX_FAMILY = ("jax", "jaxlib", "flax", "optax", "orbax", "chex")


# ------------------------------------------------------------------------------------------------------------
# The import graph (AST only: nothing is imported)
# ------------------------------------------------------------------------------------------------------------
def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_name(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or p.is_dir()


def grpo_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, target) for every grpo_jax import in `source` (all nesting levels; relative ones resolved).

    `from a.b import c` targets `a.b.c` when that is a module or package on disk, else `a.b`.
    """
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((node.lineno, sub if a.name != "*" and _is_module(sub) else base))
    return sorted({(ln, t) for ln, t in out if t == "grpo_jax" or t.startswith("grpo_jax.")})


def _under(target: str, prefixes) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def _files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _rule_files(rule: Rule) -> list[str]:
    def match(rel: str, pattern: str) -> bool:
        return fnmatch.fnmatch(rel, "grpo_jax/" + pattern)

    patterns = (rule.files,) if isinstance(rule.files, str) else rule.files
    rels = [_rel(p) for p in _files()]
    return [
        r for r in rels if any(match(r, f) for f in patterns) and not any(match(r, u) for u in rule.unless)
    ]


def violations_in(rel: str, source: str, rule: Rule) -> list[str]:
    """The imports of one file (repo path `rel`, text `source`) that break `rule`."""
    modules = ["grpo_jax." + m for m in rule.modules]
    bad = []
    for line, target in grpo_imports(source, _module_name(rel), rel.endswith("/__init__.py")):
        inside = _under(target, modules)
        if (rule.kind is ONLY and not inside) or (rule.kind is NEVER and inside):
            bad.append(f"{rel}:{line} imports {target}")
    return bad


@pytest.mark.parametrize("rule_id", list(RULES))
def test_layer_rule(rule_id):
    rule = RULES[rule_id]
    files = _rule_files(rule)
    assert files, f"rule {rule_id}: {rule.files!r} matches no file"
    bad = [v for rel in files for v in violations_in(rel, (ROOT / rel).read_text(), rule)]
    patterns = (rule.files,) if isinstance(rule.files, str) else rule.files
    what = " ".join(f"grpo_jax/{f}" for f in patterns) + f" {rule.kind} "
    what += ", ".join("grpo_jax." + m for m in rule.modules) or "nothing of grpo_jax"
    assert not bad, f"rule {rule_id} ({what}):\n  " + "\n  ".join(bad)


def import_graph() -> dict[str, set[str]]:
    """module -> the grpo_jax modules it imports (every nesting level; a package's import of its own
    submodules counts like any other)."""
    graph: dict[str, set[str]] = {}
    for path in _files():
        rel = _rel(path)
        name = _module_name(rel)
        targets = {t for _, t in grpo_imports(path.read_text(), name, rel.endswith("/__init__.py"))}
        graph[name] = {t for t in targets if t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted; [] = acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    """No two modules of grpo_jax import each other, directly or through others (function-level imports
    included): e.g. the procedural tokenizer and the HF tokenizers once did."""
    # a package's __init__ re-exporting its submodules is not a circle of the code: leave those edges out
    graph = {
        m: {
            t
            for t in ts
            if not (t.startswith(m + ".") and (PKG / m.removeprefix("grpo_jax.").replace(".", "/")).is_dir())
        }
        for m, ts in import_graph().items()
    }
    assert import_cycles(graph) == []


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_import_scanner_sees_every_kind_of_import():
    src = (
        "import os\n"
        "import grpo_jax.core.losses as L\n"
        "from grpo_jax.sandbox import types\n"
        "from grpo_jax.sandbox.types import Job\n"
        "from . import grading\n"
        "from ..train import step\n"
        "def f():\n"
        "    if True:\n"
        "        from grpo_jax import train\n"
        "class C:\n"
        "    def m(self):\n"
        "        import grpo_jax.config\n"
    )
    assert grpo_imports(src, "grpo_jax.sandbox.executor") == [
        (2, "grpo_jax.core.losses"),
        (3, "grpo_jax.sandbox.types"),
        (4, "grpo_jax.sandbox.types"),
        (5, "grpo_jax.sandbox.grading"),
        (6, "grpo_jax.train.step"),
        (9, "grpo_jax.train"),
        (12, "grpo_jax.config"),
    ]
    # each kind of rule flags a function-level import
    late = (
        "import numpy\ndef f():\n    from grpo_jax.problem import Problem\n    import grpo_jax.train.step\n"
    )
    assert violations_in("grpo_jax/sandbox/x.py", late, RULES["sandbox"]) == [
        "grpo_jax/sandbox/x.py:3 imports grpo_jax.problem",
        "grpo_jax/sandbox/x.py:4 imports grpo_jax.train.step",
    ]
    assert violations_in("grpo_jax/codegen/x.py", late, RULES["codegen"]) == [
        "grpo_jax/codegen/x.py:4 imports grpo_jax.train.step"
    ]
    ok = "from grpo_jax.sandbox.types import TestCase\n"
    assert violations_in("grpo_jax/problem.py", ok, RULES["problem"]) == []
    assert _under("grpo_jax.train", ["grpo_jax.train"]) and not _under("grpo_jax.trainer", ["grpo_jax.train"])


# ------------------------------------------------------------------------------------------------------------
# "no JAX" is checked by importing, in a fresh interpreter
# ------------------------------------------------------------------------------------------------------------
def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def no_jax_modules() -> list[str]:
    names = set(NO_JAX_MODULES)
    for path in _files():
        name = _module_name(_rel(path))
        if _under(name, NO_JAX_PACKAGES) or NO_JAX_CLAIM.search(_docstring(path)):
            names.add(name)
    return sorted(names)


_PROBE = (
    "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
    "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in sys.argv[2:])))"
)


@pytest.mark.parametrize("module", no_jax_modules())
def test_no_jax(module):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-c", _PROBE, module, *JAX_FAMILY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"import {module} failed:\n{r.stderr[-2000:]}"
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    assert not loaded, f'importing {module} loaded {loaded[:10]} ("jax" in sys.modules: {"jax" in loaded})'


def test_no_jax_list_covers_the_promises():
    names = no_jax_modules()
    for m in ("grpo_jax.problem", "grpo_jax.sandbox", "grpo_jax.sandbox.executor", "grpo_jax.codegen"):
        assert m in names
    assert "grpo_jax.codegen.pipeline" in names and "grpo_jax.codegen.passk" in names


def test_problem_reexports_the_sandbox_testcase():
    from grpo_jax import problem
    from grpo_jax.sandbox import types

    assert problem.TestCase is types.TestCase
    assert [f.name for f in dataclasses.fields(types.TestCase)] == [
        "call",
        "expected",
        "source",
        "float_tol",
        "kind",
        "wrap",
        "expected_expr",
        "prelude",
        "stdin",
        "checker",
        "input_file",
        "output_file",
    ]


# ------------------------------------------------------------------------------------------------------------
# size rules that keep the training code changeable
# ------------------------------------------------------------------------------------------------------------
MAX_TRAIN_FUNCTION_LINES = 80  # every function under grpo_jax/train/, rollout/, eval/ (nested ones included)
MAX_LOOP_LINES = 300  # grpo_jax/train/loop.py holds the run's phases only (assembly is train/build.py)


def function_sizes(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function in a file, nested ones too."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((name, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")

    visit(ast.parse(path.read_text()), "")
    return out


def test_training_functions_stay_small():
    """Every function of the training loop and of the packages it drives (train/, rollout/, eval/)."""
    files = [p for d in ("train", "rollout", "eval") for p in sorted((PKG / d).glob("*.py"))]
    sizes = {f"{_rel(p)}::{n}": k for p in files for n, k in function_sizes(p)}
    assert sizes["grpo_jax/train/step.py::make_train_step"] > 0  # the scan saw the engine
    long = {n: k for n, k in sizes.items() if k > MAX_TRAIN_FUNCTION_LINES}
    assert not long, f"functions over {MAX_TRAIN_FUNCTION_LINES} lines: {long}"
    loop_lines = len((PKG / "train" / "loop.py").read_text().splitlines())
    assert loop_lines <= MAX_LOOP_LINES, (
        f"train/loop.py has {loop_lines} lines (phases only: <= {MAX_LOOP_LINES})"
    )


def test_function_sizes_counts_nested_functions(tmp_path):
    p = tmp_path / "probe.py"
    p.write_text("def outer():\n    def inner():\n        return 1\n\n    return inner\n")
    assert function_sizes(p) == [("outer", 5), ("outer.inner", 2)]


# ------------------------------------------------------------------------------------------------------------
# every file the code, tests and docs cite is in the repository
# ------------------------------------------------------------------------------------------------------------
_CITED_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|tests|grpo_jax|experiments|launch)/[\w/.-]*\w\.(?:md|py|flags|jsonl|json|sh|sbatch|yaml))(?!\w)"
)
_CITED_DOC = re.compile(r"(?<![\w/.-])([A-Z][A-Z_]+\.md)\b")
_PLACEHOLDERS = ("NAME", "/x.py")  # a recipe's "grpo_jax/algorithms/NAME.py", the import scanner's probes


def cited_files(text: str) -> list[str]:
    """Repository paths and documents (capitalised .md names) a text cites."""
    refs = [m.group(1) for m in _CITED_PATH.finditer(text)] + [m.group(1) for m in _CITED_DOC.finditer(text)]
    return [r for r in refs if not any(p in r for p in _PLACEHOLDERS)]


def test_every_cited_file_exists():
    """A path like docs/GRPO_MATH.md or grpo_jax/train/step.py in any source, test, flagfile or doc, and a
    document named like SANDBOX.md (next to the citing file, at the root or in docs/), exists: a fresh clone
    can check every reference (the design documents this project started from are not part of it)."""
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    suffixes = (".py", ".md", ".flags", ".json", ".sh", ".sbatch", ".yaml", ".txt", ".toml")
    missing = []
    for rel in out.split():
        if not rel.endswith(suffixes) or rel.startswith("tests/sandbox_corpus/"):
            continue
        path = ROOT / rel
        for ref in cited_files(path.read_text(encoding="utf-8", errors="replace")):
            where = (ROOT / ref, path.parent / ref, ROOT / "docs" / ref)
            if not any(p.exists() for p in where):
                missing.append(f"{rel} cites {ref}")
    assert not missing, "\n".join(missing)


def test_cited_files_finds_paths_and_documents():
    text = "see docs/GRPO_MATH.md §4, grpo_jax/train/step.py and SANDBOX.md; not x/docs/y.md nor NAME.py"
    assert cited_files(text) == ["docs/GRPO_MATH.md", "grpo_jax/train/step.py", "SANDBOX.md"]
