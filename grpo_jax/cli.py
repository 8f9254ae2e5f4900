"""The command line of a run, DERIVED from the config tree (grpo_jax.config): one absl flag per leaf field.

    define_flags(FLAGS)                        # --d_model, --kl_coef, --pool_capacity, ... from RunConfig
    argv = parse(sys.argv)                     # absl parsing with one-line errors (exit status 2)
    cfg, notes = config_from_flags(FLAGS)      # RunConfig (validated) + what the precedence rule decided

A leaf field `f` of a section with FLAG_PREFIX `p` is the flag `--{p}{f}` unless its metadata names the flag;
its help text, default and type come from the field (str fields list their valid values; the value check is
the dataclass's own, so an error reads `--kl_coef=-1.0: must be >= 0`). Types: bool, int, float, str;
`float | None` / `int | None` ("none" = None, or the one word the field names: `--sft_steps=auto`); tuples
as comma lists (`--eval_ks=1,8`); schedules as `step:value` lists (`--pool_k_schedule=0:8,100:16`). Fields
marked "derived" have no flag.

Precedence, one rule: defaults < everything on the command line in the order written, flagfiles expanded
where they appear; the LAST setting of a field wins. `--preset=NAME` counts as setting all of the preset's
fields (grpo_jax.presets) at the place it appears. So `--flagfile=quickstart.flags --preset=dapo` gives
DAPO's β even though quickstart.flags sets `--kl_coef=0`, and `--preset=dapo --kl_coef=0.01` gives β =
0.01. Every field where a preset and a flag disagree is reported in the notes (printed at start, kept in
run.json), so a preset is never undone silently. A few defaults depend on the model (config.AUTO_DEFAULTS:
a pretrained --init_from model gets --sft_steps=0 and --prompt_format=chat): a given value always wins, and
the notes say which of them a pretrained model took.

This is the only module that reads absl flags; the library takes a RunConfig.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from typing import Any

from absl import flags

from grpo_jax import config as C
from grpo_jax.errors import ConfigError

_EXPANDED: list[str] = []
# ModelConfig fields that a pretrained checkpoint (--init_from) decides
_SHAPE_FIELDS = (
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "d_ff",
    "qkv_bias",
    "tie_embeddings",
)  # argv with flagfiles expanded in place (set by `parse`), for the precedence rule


# ------------------------------------------------------------------------------------------------------------
# parsers for the non-scalar field types
# ------------------------------------------------------------------------------------------------------------


class _Optional(flags.ArgumentParser):
    """A value of `inner`, or None spelled as one of `words` ("none" / "off" / empty; a field's metadata may
    name its own word, e.g. "auto" for --sft_steps, where "none" would read as "no SFT")."""

    def __init__(self, inner: type, words: tuple[str, ...] = ("", "none", "off")):
        self.inner, self.words = inner, words

    def parse(self, argument):
        if argument is None or (isinstance(argument, str) and argument.strip().lower() in self.words):
            return None
        try:
            return self.inner(argument)
        except (TypeError, ValueError):
            raise ValueError(f"expected a {self.inner.__name__} or {self.words[-1]}") from None

    def flag_type(self):
        return f"{self.inner.__name__} or {self.words[-1]}"


class _Tuple(flags.ArgumentParser):
    """'1,8' -> (1, 8); a tuple default is taken as it is."""

    def __init__(self, inner: type):
        self.inner = inner

    def parse(self, argument):
        if isinstance(argument, tuple | list):
            return tuple(self.inner(x) for x in argument)
        items = [x.strip() for x in str(argument).split(",") if x.strip()]
        try:
            return tuple(self.inner(x) for x in items)
        except ValueError:
            raise ValueError(f"expected a comma-separated list of {self.inner.__name__}") from None

    def flag_type(self):
        return f"comma-separated {self.inner.__name__} list"


class _Schedule(flags.ArgumentParser):
    """'0:8,100:16' -> ((0, 8), (100, 16))."""

    def __init__(self, value_type: type):
        self.value_type = value_type

    def parse(self, argument):
        if isinstance(argument, tuple | list):
            return tuple((int(s), self.value_type(v)) for s, v in argument)
        out = []
        for item in (x.strip() for x in str(argument).split(",")):
            if not item:
                continue
            try:
                s, v = item.split(":")
                out.append((int(s), self.value_type(v)))
            except ValueError:
                raise ValueError(
                    f"expected 'step:value,...' pairs (step an int, value a {self.value_type.__name__}), "
                    "e.g. 0:8,100:16"
                ) from None
        return tuple(out)

    def flag_type(self):
        return "step:value list"


class _Serializer(flags.ArgumentSerializer):
    def __init__(self, none_word: str = "none"):
        self.none_word = none_word

    def serialize(self, value):
        return self.none_word if value is None else format_value(value)


def format_value(value: Any) -> str:
    """How a field value is written on the command line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(":".join(map(str, v)) if isinstance(v, tuple | list) else str(v) for v in value)
    return str(value)


# ------------------------------------------------------------------------------------------------------------
# the flag table
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    flag: str  # absl flag name
    path: str  # dotted RunConfig path
    owner: type  # the dataclass that owns the field
    field: str
    kind: str  # bool | int | float | str | optional | tuple | schedule


def flag_table(root: type = C.RunConfig) -> list[FlagSpec]:
    """Every leaf field of the tree with its flag name, in tree order."""
    out: list[FlagSpec] = []

    def walk(cls: type, prefix: str) -> None:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, tp in C.field_types(cls).items():
            f = fields[name]
            if C.is_section(tp):
                walk(tp, f"{prefix}{name}.")
                continue
            if "derived" in f.metadata:
                continue
            flag = f.metadata.get("flag", getattr(cls, "FLAG_PREFIX", "") + name)
            out.append(FlagSpec(flag, prefix + name, cls, name, _kind(tp)))

    walk(root, "")
    names = [s.flag for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AssertionError(f"config fields map to the same flag: {dup}")
    return out


def _kind(tp: Any) -> str:
    if tp is bool:
        return "bool"
    if tp in (int, float, str):
        return tp.__name__
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType) and type(None) in args:
        return "optional"
    if typing.get_origin(tp) is tuple:
        return "schedule" if typing.get_origin(args[0]) is tuple else "tuple"
    raise TypeError(f"no flag type for {tp!r}")


def _inner(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0]


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> list[FlagSpec]:
    """Define one absl flag per leaf of RunConfig in `fv` (once); returns the flag table."""
    table = flag_table()
    types_ = {}
    for cls in C.SECTIONS:
        for name, tp in C.field_types(cls).items():
            types_[(cls, name)] = tp
    for spec in table:
        f = {x.name: x for x in dataclasses.fields(spec.owner)}[spec.field]
        tp = types_[(spec.owner, spec.field)]
        help_ = f.metadata.get("help", spec.field)
        if "choices" in f.metadata:
            help_ += f" (valid: {', '.join(f.metadata['choices'])})"
        default: Any = f.default if f.default is not dataclasses.MISSING else None
        if spec.kind == "bool":
            flags.DEFINE_bool(spec.flag, default, help_, flag_values=fv)
        elif spec.kind == "int":
            flags.DEFINE_integer(spec.flag, default, help_, flag_values=fv)
        elif spec.kind == "float":
            flags.DEFINE_float(spec.flag, default, help_, flag_values=fv)
        elif spec.kind == "str":
            flags.DEFINE_string(spec.flag, default, help_, flag_values=fv)
        else:
            word = f.metadata.get("none_word")
            parser: flags.ArgumentParser
            if spec.kind == "optional":
                parser = _Optional(_inner(tp), (word,) if word else ("", "none", "off"))
            elif spec.kind == "tuple":
                parser = _Tuple(typing.get_args(tp)[0])
            else:
                parser = _Schedule(typing.get_args(typing.get_args(tp)[0])[1])
            flags.DEFINE(parser, spec.flag, default, help_, fv, serializer=_Serializer(word or "none"))
    return table


# ------------------------------------------------------------------------------------------------------------
# flags -> RunConfig
# ------------------------------------------------------------------------------------------------------------


def _positions(expanded: list[str], fv: flags.FlagValues) -> dict[str, int]:
    """{flag name: index of its last occurrence} in the expanded argv."""
    pos: dict[str, int] = {}
    for i, arg in enumerate(expanded):
        if arg == "--":
            break
        if not arg.startswith("-"):
            continue
        name = arg.lstrip("-").split("=", 1)[0]
        if name not in fv and name.startswith("no") and name[2:] in fv:
            name = name[2:]
        pos[name] = i
    return pos


def config_from_flags(fv: flags.FlagValues = flags.FLAGS, expanded: list[str] | None = None):
    """(RunConfig, notes) from parsed flags. `expanded`: the argv with flagfiles inlined (default: what
    `parse` saw); it decides which of a preset and a flag came last. Raises ConfigError-derived
    `FlagError` with the flag's name on a bad value."""
    from grpo_jax import presets

    table = flag_table()
    pos = _positions(_EXPANDED if expanded is None else expanded, fv)
    by_path = {s.path: s for s in table}
    values: dict[str, Any] = {}
    where: dict[str, int] = {}
    for s in table:
        if fv[s.flag].present:
            values[s.path] = _value(fv[s.flag].value, s.kind)
            where[s.path] = pos.get(s.flag, len(pos) + 1)
    notes: list[str] = []
    name = values.get("preset", "")
    if name:
        try:
            preset = presets.get_preset(name)
        except ValueError as e:
            raise FlagError(f"--preset={name}: {e}") from None
        at = pos.get("preset", -1)
        for path, v in preset.values:
            if path in values and where[path] > at:
                if values[path] != v:
                    notes.append(
                        f"preset {name}: {by_path[path].flag}={format_value(v)} replaced by "
                        f"--{by_path[path].flag}={format_value(values[path])} (given after --preset)"
                    )
                continue
            if path in values and values[path] != v:
                notes.append(
                    f"preset {name}: --{by_path[path].flag}={format_value(values[path])} (given before "
                    f"--preset) replaced by the preset's {format_value(v)}"
                )
            values[path] = v
        notes.append(f"preset {name}: {preset.notes}")
    shape = [s for s in table if s.owner is C.ModelConfig and s.field in _SHAPE_FIELDS and fv[s.flag].present]
    if values.get("model.init_from") and shape:
        s = shape[0]
        raise FlagError(
            f"--{s.flag}={format_value(values[s.path])}: the model's shape comes from --init_from="
            f"{values['model.init_from']}; drop the shape flags ({', '.join('--' + x.flag for x in shape)})"
        )
    try:
        cfg = C.from_leaves(values)
    except ConfigError as e:
        raise FlagError(describe(e, table)) from None
    notes += _auto_notes(cfg, values, by_path)
    return cfg, notes


_AUTO_MEANS = {"sft.steps": " (no SFT)"}  # what a resolved auto default means, where the value does not say


def _auto_notes(cfg: C.RunConfig, values: dict[str, Any], by_path: dict[str, FlagSpec]) -> list[str]:
    """The line saying which model-dependent defaults (config.AUTO_DEFAULTS) a pretrained model took: those
    not given (or given as auto) on the command line; none from scratch (the defaults as they always were)."""
    if not cfg.model.init_from:
        return []
    took = [p for p in C.AUTO_DEFAULTS if values.get(p) in (None, "auto")]
    if not took:
        return []
    said = ", ".join(
        f"--{by_path[p].flag}={format_value(C.get_path(cfg, p))}{_AUTO_MEANS.get(p, '')}" for p in took
    )
    one = len(took) == 1
    return [
        f"init_from: pretrained-model default{'' if one else 's'}: {said} "
        f"(give {'it' if one else 'them'} to override)"
    ]


def _value(v: Any, kind: str) -> Any:
    if kind in ("tuple", "schedule"):
        return tuple(v)
    return v


class FlagError(ValueError):
    """A flag value the config rejects; the message starts with the flag: `--name=value: why`."""


def describe(e: ConfigError, table: list[FlagSpec] | None = None) -> str:
    """A ConfigError rewritten in terms of the flag that sets the field."""
    table = table or flag_table()
    owner_paths: dict[str, str] = {}
    for s in table:  # the path of each section class, from any of its fields
        owner_paths.setdefault(s.owner.__name__, s.path[: -len(s.field)])
    path = owner_paths.get(e.owner, "") + e.field
    for s in table:
        if s.path == path:
            return f"--{s.flag}={format_value(e.value)}: {e.why}"
    return str(e)


def fail(msg: str) -> typing.NoReturn:
    """One line on stderr, exit status 2, nothing written."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def parse(argv: list[str], fv: flags.FlagValues = flags.FLAGS) -> list[str]:
    """absl flag parsing with a one-line error (missing or garbled flagfile, bad type, unknown flag); keeps
    the flagfile-expanded argv for the precedence rule."""
    global _EXPANDED
    try:
        rest, _EXPANDED = _parse(argv, fv)
    except FlagError as e:
        fail(str(e))
    return rest


def _parse(argv: list[str], fv: flags.FlagValues) -> tuple[list[str], list[str]]:
    """(positional arguments, the argv with flagfiles expanded in place); FlagError with the one line."""
    try:
        rest = fv(argv)
        return rest, fv.read_flags_from_files(list(argv[1:]), force_gnu=False)
    except flags.Error as e:
        raise FlagError(str(e).replace("ERROR:: ", "")) from None
    except UnicodeDecodeError as e:  # a flagfile that is not text
        raise FlagError(f"a --flagfile is not valid UTF-8 text ({e.reason} at byte {e.start})") from None


def resolve(argv: list[str]) -> tuple[C.RunConfig, list[str]]:
    """(RunConfig, notes) of a command line (argv[0] is the program's name), parsed into a fresh FlagValues:
    the main job's flag handling in-process (library use and tests). Any bad input raises FlagError with
    the one line the main job prints before exiting with status 2."""
    fv = flags.FlagValues()
    define_flags(fv)
    rest, expanded = _parse(argv, fv)
    if len(rest) > 1:
        raise FlagError(f"unexpected positional arguments: {' '.join(rest[1:])}")
    return config_from_flags(fv, expanded)
