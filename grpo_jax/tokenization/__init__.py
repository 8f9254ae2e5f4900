"""Tokenizers, in one JAX-free package: the `Tokenizer` interface (base), the procedural `CodeTokenizer`
(code), real tokenizers from tokenizer.json or GGUF metadata with their chat templates (hf), and
`load_tokenizer`, which opens any of them from a directory or a .gguf file.

    tok = load_tokenizer("path/to/dir")         # tokenizer.json (+ tokenizer_config.json, ...) -> HFTokenizer
    tok = load_tokenizer("model.Q4_1.gguf")     # rebuilt from the GGUF metadata              -> HFTokenizer
    tok = CodeTokenizer()                       # the procedural suite's 512-id tokenizer, same interface
    prompt, mask = pad_prompts(tok, chats)      # left-padded [B, P] token ids for the sampler
    texts = decode_completions(tok, tokens, mask)   # completions back to text (cut at the end of the turn)

Layers: base <- hf <- code <- this module, base <- batch (no circle); nothing here imports JAX or the rest
of grpo_jax.
Known checkpoint names (e.g. smollm2-135m-instruct) are resolved by grpo_jax.pretrained.load_tokenizer.
"""

from __future__ import annotations

import json
import os

from grpo_jax.tokenization.base import Tokenizer
from grpo_jax.tokenization.batch import decode_completions, pad_prompts, stop_ids
from grpo_jax.tokenization.code import CODE_MARKER, CodeTokenizer, save_code_tokenizer
from grpo_jax.tokenization.hf import HFTokenizer, render_chat_template

__all__ = [
    "CodeTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "decode_completions",
    "load_tokenizer",
    "pad_prompts",
    "render_chat_template",
    "save_code_tokenizer",
    "stop_ids",
]


def load_tokenizer(path: str | os.PathLike, pre_tokenizer: str = "transformers") -> Tokenizer:
    """A directory with tokenizer.json, or a .gguf file (its tokenizer rebuilt from the metadata; the split
    rule of `pre_tokenizer`, see `build_gguf_backend`).

    A directory written by `CodeTokenizer.save` gives back a CodeTokenizer (its recorded fingerprint must
    match this code's vocabulary); any other directory an HFTokenizer."""
    path = os.fspath(path)
    if os.path.isdir(path):
        cfg_file = os.path.join(path, "tokenizer_config.json")
        marker = None
        if os.path.isfile(cfg_file):
            with open(cfg_file, encoding="utf-8") as f:
                try:
                    marker = json.load(f).get(CODE_MARKER)
                except (json.JSONDecodeError, AttributeError):
                    marker = None  # HFTokenizer.from_pretrained reports the bad file
        if marker is not None:
            tok = CodeTokenizer()
            if marker != tok.fingerprint():
                raise ValueError(
                    f"{cfg_file}: {CODE_MARKER}={str(marker)[:12]}... does not match this CodeTokenizer "
                    f"({tok.fingerprint()[:12]}...): the procedural vocabulary changed since it was saved"
                )
            return tok
        return HFTokenizer.from_pretrained(path)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF":
            return HFTokenizer.from_gguf(path, pre_tokenizer)
        raise ValueError(
            f"{path}: not a tokenizer (valid: a directory with tokenizer.json, or a GGUF file; this file "
            f"starts with {magic!r}, not b'GGUF')"
        )
    raise FileNotFoundError(
        f"{path}: no such file or directory (valid: a tokenizer directory or a .gguf file)"
    )
