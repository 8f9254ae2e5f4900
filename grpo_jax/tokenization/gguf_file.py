"""Reading a GGUF file's metadata (no JAX): shared by the tokenizer rebuilt from a GGUF
(grpo_jax.tokenization.hf) and the model loader (grpo_jax.pretrained.gguf)."""

from __future__ import annotations

import os
from typing import Any


def open_gguf(path: str | os.PathLike):
    """A memory-mapped `gguf.GGUFReader` over `path`; one clear error for a missing or non-GGUF file."""
    import gguf

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (first bytes {magic!r}, expected b'GGUF')")
    return gguf.GGUFReader(path, "r")


def field_value(reader, key: str, default: Any = None) -> Any:
    """The decoded value of metadata field `key` (str / int / float / bool / list), or `default` if absent."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()
