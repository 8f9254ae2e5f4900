"""The one registry of dataset formats: every list of formats the project shows is derived from it.

Each module of grpo_jax/data/formats declares one `Format` at import (its name, the fields that identify its
rows, a one-line description, the public loader or card its fields follow, its converter, and optionally the
columns it reads and how a row's difficulty is found). `FORMATS` (name -> Format, in detection order) is what
the config's `--data_format` choices, the detection of a file's format, the "unknown schema" error and the
table of docs/DATA_FORMATS.md are made from (tests/test_data_formats.py checks the docs table against it).
The formats register when grpo_jax.data.formats is imported, which importing the package grpo_jax.data (or any
module of it) does first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from grpo_jax.data.common import Ctx
from grpo_jax.problem import Problem


@dataclasses.dataclass(frozen=True)
class Format:
    """name: what --data_format / fmt= say; signature: the fields whose presence identifies a row of this
    format (detection checks the formats in registry order, first match wins); description: one line for
    errors and docs; follows: the public loader / card the converter follows (cited in docs); convert:
    (row, Ctx) -> Problem, raising DatasetError (HumanEval / MBPP: their converters in
    grpo_jax.codegen.datasets); aliases: other names for it (e.g. taco = apps);
    columns: the columns a columnar file (parquet / Arrow) needs read (None: all); difficulty: a row's
    difficulty as a str or int (None: the format has none), for --difficulty; unique_ids: task ids must be
    unique in the input (HumanEval / MBPP files keep their old rule: not checked); order: the detection
    order (lower first; ties by name)."""

    name: str
    signature: tuple[str, ...]
    description: str
    follows: str
    convert: Callable[[dict, Ctx], Problem]
    aliases: tuple[str, ...] = ()
    columns: tuple[str, ...] | None = None
    difficulty: Callable[[dict], Any] | None = None
    unique_ids: bool = True
    order: int = 50

    @property
    def title(self) -> str:
        """E.g. "MBPP (task_id, text, code, test_list)": the name and the identifying fields."""
        return f"{self.description} ({', '.join(self.signature)})"


FORMATS: dict[str, Format] = {}
ALIASES: dict[str, str] = {}


def register(fmt: Format) -> Format:
    """Add a format (called once by its module). Names and aliases are unique."""
    for n in (fmt.name, *fmt.aliases):
        if n in FORMATS or n in ALIASES or n == "auto":
            raise ValueError(f"data format {n!r} registered twice")
    FORMATS[fmt.name] = fmt
    for a in fmt.aliases:
        ALIASES[a] = fmt.name
    return fmt


def sort() -> None:
    """Put FORMATS in detection order (by `order`, then name); grpo_jax.data.formats calls it once all its
    modules registered."""
    items = sorted(FORMATS.values(), key=lambda f: (f.order, f.name))
    FORMATS.clear()
    FORMATS.update((f.name, f) for f in items)


def names(with_aliases: bool = True) -> tuple[str, ...]:
    """The format names in detection order (and their aliases after them)."""
    return tuple(FORMATS) + (tuple(ALIASES) if with_aliases else ())


def get(name: str) -> Format:
    """The Format of a name or alias; ValueError listing the valid ones."""
    key = ALIASES.get(name, name)
    if key not in FORMATS:
        raise ValueError(f"unknown data format {name!r}; valid: {', '.join(names())}")
    return FORMATS[key]


def detect(fields) -> Format | None:
    """The first format (registry order) whose signature the row's / the file's fields contain."""
    keys = set(fields)
    for fmt in FORMATS.values():
        if keys.issuperset(fmt.signature):
            return fmt
    return None


def docs_table() -> str:
    """The formats table of docs/DATA_FORMATS.md (between its "formats table: generated" markers), in
    detection order: `python -m grpo_jax.data` prints it."""
    rows = ["| format (aliases) | identifying fields | difficulty | follows |", "|---|---|---|---|"]
    for f in FORMATS.values():
        name = f"`{f.name}`" + (f" ({', '.join(f'`{a}`' for a in f.aliases)})" if f.aliases else "")
        diff = "yes" if f.difficulty else "—"
        rows.append(f"| {name} | {', '.join(f.signature)} | {diff} | {f.follows} |")
    return "\n".join(rows)
