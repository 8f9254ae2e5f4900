"""The tokenizer interface of the whole trainer (no JAX): what the rollout, the evaluator and SFT need of a
tokenizer, satisfied by the procedural `CodeTokenizer` (grpo_jax.tokenization.code) and by real ones
(`HFTokenizer`, grpo_jax.tokenization.hf). Annotate with `Tokenizer`, never with a concrete class."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """What the trainer needs from a tokenizer. Ids are model ids; `vocab_size` is the tokenizer's own count
    (a model's embedding may have more rows)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def pad_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...  # the primary stop id (what a completion is terminated with in SFT data)
    @property
    def eos_ids(self) -> tuple[int, ...]: ...  # every id that ends a generation (eos_id first)
    @property
    def bos_id(self) -> int | None: ...
    @property
    def chat_template(self) -> str | None: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...
    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str: ...
    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str: ...
    def fingerprint(self) -> str: ...
    def save(self, path: str | os.PathLike) -> None: ...
