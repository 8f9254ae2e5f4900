"""Static analysis of generated programs WITHOUT running or importing them: ruff (pinned in requirements.txt),
a separate process that only parses the text.

    report = analyse(programs)        # [N] Report(parses, diagnostics)

The programs are written to a private temporary directory and checked in ONE ruff process
(`ruff check --isolated --select=E4,E7,E9,F`: pyflakes and pycodestyle's error rules, no configuration file
read); a batch that takes longer than `timeout_s` is checked again one program at a time, and a program that
still does not finish counts as not parsing. Nothing of a program is imported or executed in the trainer.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from typing import NamedTuple

RULES = "E4,E7,E9,F"


class Report(NamedTuple):
    parses: bool  # no syntax error
    diagnostics: int  # ruff's diagnostics other than syntax errors


class StaticAnalysisError(RuntimeError):
    """ruff could not be run (not installed, or it failed): the rewards that need it cannot be computed."""


def ruff_bin() -> str:
    """The ruff executable of this environment (the `ruff` package's own binary)."""
    try:
        from ruff.__main__ import find_ruff_bin  # type: ignore[import-untyped]
    except ImportError as e:  # requirements.txt pins it; a hand-made environment may lack it
        raise StaticAnalysisError(
            "the format / lint rewards need ruff: pip install -r requirements.txt"
        ) from e
    return os.fsdecode(find_ruff_bin())


def _run(directory: str, names: Sequence[str], timeout_s: float) -> dict[str, list[str]]:
    """{file name: [diagnostic codes]} of ruff on `names` in `directory` (TimeoutExpired after timeout_s)."""
    cmd = [ruff_bin(), "check", "--isolated", "--no-cache", f"--select={RULES}", "--output-format=json"]
    cmd += ["--exit-zero", "--quiet", "--", *names]
    out = subprocess.run(cmd, cwd=directory, capture_output=True, timeout=timeout_s, check=False, text=True)
    if out.returncode != 0:
        raise StaticAnalysisError(f"ruff failed (exit {out.returncode}): {out.stderr.strip()[-300:]}")
    found: dict[str, list[str]] = {}
    for d in json.loads(out.stdout or "[]"):
        found.setdefault(os.path.basename(d["filename"]), []).append(d.get("code") or "invalid-syntax")
    return found


def analyse(programs: Sequence[str], timeout_s: float = 60.0, per_program_s: float = 5.0) -> list[Report]:
    """One Report per program (see the module docstring)."""
    if not programs:
        return []
    with tempfile.TemporaryDirectory(prefix="grpo_static_") as d:
        names = [f"p{i}.py" for i in range(len(programs))]
        for name, text in zip(names, programs, strict=True):
            with open(os.path.join(d, name), "w", encoding="utf-8", errors="replace") as f:
                f.write(text)
        try:
            found = _run(d, names, timeout_s)
        except subprocess.TimeoutExpired:
            found = {}
            for name in names:
                try:
                    found.update(_run(d, [name], per_program_s))
                except subprocess.TimeoutExpired:
                    found[name] = ["invalid-syntax"]  # not analysable in time: counts as not parsing
    reports = []
    for name in names:
        codes = found.get(name, [])
        bad = sum(c == "invalid-syntax" for c in codes)
        reports.append(Report(parses=bad == 0, diagnostics=len(codes) - bad))
    return reports
