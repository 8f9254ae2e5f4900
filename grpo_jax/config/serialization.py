"""A config tree as data: its leaves as {dotted path: value} and back (validated), and nested dicts (a
RunConfig's to_json(), the "config" of a run.json or a checkpoint) flattened. Reading an OLD saved config is
grpo_jax.config.migration's."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from grpo_jax.config.run import RunConfig


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def field_types(cls: type) -> dict[str, Any]:
    """{field name: resolved type} of a config dataclass (ClassVars excluded)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def flat_dict(d: dict, prefix: str = "") -> dict:
    """A nested dict (RunConfig.to_json(), a saved run.json "config") as {dotted path: leaf value}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_dict(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _unvalidated(values: dict[str, Any], cls: type, prefix: str = "") -> Any:
    """A config tree of `cls` holding {dotted path: value} as given, without validation (for reading the
    switches of a saved config, whatever it holds)."""
    obj: Any = object.__new__(cls)
    for name, tp in field_types(cls).items():
        path = prefix + name
        v = _unvalidated(values, tp, path + ".") if is_section(tp) else values.get(path)
        object.__setattr__(obj, name, v)
    return obj


def leaves(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted path: value} of every leaf field of a config tree (sections flattened)."""
    out: dict[str, Any] = {}
    for name, tp in field_types(type(cfg)).items():
        v = getattr(cfg, name)
        if is_section(tp):
            out.update(leaves(v, f"{prefix}{name}."))
        else:
            out[prefix + name] = v
    return out


def from_leaves(values: dict[str, Any], cls: type = RunConfig, prefix: str = "") -> Any:
    """Build (and so validate, every section bottom-up, then the cross-section rules) a config tree from
    {dotted path: value}; paths that are absent take the field's default. Unknown paths are a KeyError."""
    if not prefix:
        known = set(leaves(_defaults(cls)))
        unknown = sorted(set(values) - known)
        if unknown:
            raise KeyError(f"unknown config fields: {', '.join(unknown)}")
    kwargs = {}
    for name, tp in field_types(cls).items():
        path = prefix + name
        if is_section(tp):
            kwargs[name] = from_leaves(values, tp, path + ".")
        elif path in values:
            kwargs[name] = values[path]
    return cls(**kwargs)


def _defaults(cls: type) -> Any:
    """An instance of `cls` with default values that skips validation (the root needs a workdir)."""
    obj: Any = object.__new__(cls)
    for name, tp in field_types(cls).items():
        f = {x.name: x for x in dataclasses.fields(cls)}[name]
        default = _defaults(tp) if is_section(tp) else f.default
        object.__setattr__(obj, name, default)
    return obj
