"""Real tokenizers (no JAX): a model's tokenizer.json, or one rebuilt from GGUF metadata, with its special
tokens, end-of-generation ids and chat template, behind the `Tokenizer` interface (grpo_jax.tokenization).

    tok = HFTokenizer.from_pretrained("path/to/dir")    # tokenizer.json (+ tokenizer_config.json, ...)
    tok = HFTokenizer.from_gguf("model.Q4_1.gguf")      # rebuilt from the GGUF metadata
    prompt = tok.apply_chat_template([{"role": "user", "content": "..."}])   # render only
    ids = tok.encode(prompt)                            # the template already wrote the special tokens

Host side only (never inside a jit). Runtime needs `tokenizers` and `jinja2` (and `gguf` for .gguf files),
never `transformers`; the tests compare against transformers.

Where each rule comes from:

* Byte-level BPE from a GGUF (`tokenizer.ggml.model == "gpt2"`) is rebuilt as transformers does
  (transformers/integrations/gguf/gguf_tokenizer_mapping.py `byte_level_tokenizer`, `add_gguf_special_tokens`,
  and models/gpt2/tokenization_gpt2.py `GPT2Tokenizer`): vocab = `tokenizer.ggml.tokens` (re-spelled into
  GPT-2's byte alphabet if a token uses other characters), merges = `tokenizer.ggml.merges`, BPE with no unk /
  dropout / prefixes, tokens of `token_type` 3 (CONTROL) added as special tokens and 4 (USER_DEFINED) as plain
  added tokens, a ByteLevel decoder, no normalizer.
* The pre-tokenizer follows `tokenizer.ggml.pre`, i.e. llama.cpp's own split rules (src/llama-vocab.cpp,
  `llm_tokenizer_bpe` `regex_exprs` per `LLAMA_VOCAB_PRE_TYPE_*`); see `_PRE_TOKENIZERS`. For "smollm" (and
  starcoder / refact / command-r / codeshell / exaone / minerva) llama.cpp splits on `\\p{N}` first, then
  applies the GPT-2 regex: here `Digits(individual_digits=True)` + `ByteLevel(use_regex=True)`, which is what
  SmolLM2's own tokenizer.json holds. transformers 5.23's GGUF converter has no entry for "smollm" and keeps
  GPT-2's plain ByteLevel split, which tokenizes whitespace before a numeric character differently
  ("a  1": llama.cpp and SmolLM2 give [a, "ĠĠ", 1], transformers-from-GGUF [a, "Ġ", "Ġ", 1]; " ½": ["Ġ", "Â½"]
  vs ["ĠÂ", "½"]); everywhere else they agree. The DEFAULT (`pre_tokenizer="transformers"`) is transformers'
  conversion, so ids equal what a user loading the same GGUF with transformers gets (the parity contract);
  `pre_tokenizer="llama.cpp"` gives llama.cpp's / SmolLM2's own rule.
  An unknown or absent `tokenizer.ggml.pre` is an error (a silently wrong split changes ids).
* Special tokens: bos / eos / unk / pad from `tokenizer.ggml.{bos,eos,unknown,padding}_token_id` (the four
  transformers reads); for a directory from tokenizer_config.json (strings or AddedToken dicts), then
  special_tokens_map.json. `add_bos_token` / `add_eos_token` (GGUF) become the post-processor; for a
  directory the tokenizer.json post-processor decides (transformers ignores add_bos_token when tokenizer.json
  exists: tokenization_utils_base.py `_from_pretrained`).
* `eos_ids` (every id that ends a generation) = eos, then for a GGUF `tokenizer.ggml.eot_token_id` /
  `eom_token_id`, for a directory generation_config.json / config.json `eos_token_id` (int or list), then
  every token whose text llama.cpp treats as end-of-generation (`special_eog_ids`: <|im_end|>, <|endoftext|>,
  <|eot_id|>, <|end|>, <end_of_turn>, ...; `_EOG_TOKENS`). `pad_id` falls back to `eos_id` when no pad token
  is set (transformers' usual `pad_token = eos_token`).
* Chat templates render exactly as transformers' `apply_chat_template(..., tokenize=False)`
  (transformers/utils/chat_template_utils.py `_cached_compile_jinja_template` / `render_jinja_template`):
  jinja2 ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols), `tojson` (no HTML
  escaping, ensure_ascii=False), `raise_exception`, `strftime_now`, a restricted `namespace`, a no-op
  `{% generation %}` block; variables messages (None-valued keys dropped), tools=None, documents=None,
  add_generation_prompt and the named special tokens (bos_token, eos_token, unk_token, pad_token, ...).
  A directory's template is chat_template.jinja if present (transformers v5 gives it priority), else
  tokenizer_config.json `chat_template` (a string, or a list of {name, template} with "default").
* `save(dir)` writes tokenizer.json, tokenizer_config.json (special tokens, chat_template,
  tokenizer_class PreTrainedTokenizerFast), special_tokens_map.json and chat_template.jinja, so
  `transformers.AutoTokenizer.from_pretrained(dir)` gives the same ids and template (tested).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SPECIAL_TOKEN_ATTRS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

# llama.cpp src/llama-vocab.cpp `special_eog_ids`: token texts that end a generation wherever they appear
_EOG_TOKENS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
)

# Split regexes of llama.cpp (llama-vocab.cpp) = transformers' GGUF_PRE_TOKENIZER_SPLITS / Qwen2's regex.
# GPT-2's own regex is the one built into tokenizers' ByteLevel(use_regex=True).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> split rule (llama.cpp llama-vocab.cpp regex_exprs per LLAMA_VOCAB_PRE_TYPE_*)
_PRE_TOKENIZERS: dict[str, str] = {
    **dict.fromkeys(("gpt2", "mpt", "olmo", "jais"), "gpt2"),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"), "digits+gpt2"
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"),
        "split:" + _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), "split:" + _QWEN2_SPLIT),
}


# ----------------------------------------------------------------------------------------------------------
# chat templates (transformers/utils/chat_template_utils.py)


@functools.lru_cache(maxsize=16)
def _compile_template(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (transformers' AssistantTracker) rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    class _Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat template: namespace attribute {name!r} not allowed"
                )

    class _Dict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        from datetime import datetime

        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env.from_string(template)


def _check_template(template: str | None, where: str) -> None:
    """A chat template that does not compile is an error when the tokenizer is loaded (ValueError naming
    `where`), not when the first prompt is rendered."""
    if template is None:
        return
    import jinja2

    try:
        _compile_template(template)
    except jinja2.exceptions.TemplateError as e:
        lineno = getattr(e, "lineno", None)  # TemplateSyntaxError has it, other TemplateErrors do not
        line = f" at line {lineno}" if lineno else ""
        raise ValueError(f"{where}: not a valid Jinja template ({e.message or e}{line})") from None


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """The string transformers' `apply_chat_template(messages, tokenize=False, ...)` renders."""
    if not messages:
        raise ValueError(
            "apply_chat_template: messages is empty (valid: a list of {'role', 'content'} dicts)"
        )
    chat = []
    for n, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"apply_chat_template: messages[{n}] is {type(m).__name__}, expected a dict")
        chat.append({k: v for k, v in m.items() if v is not None})
    variables = {**(special_tokens or {}), **kwargs}
    return _compile_template(template).render(
        messages=chat, tools=None, documents=None, add_generation_prompt=add_generation_prompt, **variables
    )


# ----------------------------------------------------------------------------------------------------------
# the tokenizers-backed implementation


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (openai/gpt-2 encoder.py; transformers' bytes_to_unicode)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"special token {value!r}: expected a string or a dict with 'content'")


class HFTokenizer:
    """A `tokenizers.Tokenizer` plus the special tokens, end-of-generation ids and chat template of a model.

    Build with `HFTokenizer.from_pretrained(dir)` (tokenizer.json) or `HFTokenizer.from_gguf(path)`."""

    def __init__(
        self,
        backend,
        *,
        special_tokens: Mapping[str, str],
        chat_template: str | None = None,
        extra_eos_ids: Iterable[int] = (),
        source: str = "<memory>",
    ) -> None:
        self._tok = backend
        self._source = source
        self._special = {k: v for k, v in special_tokens.items() if v is not None}
        for attr in self._special:
            if attr not in SPECIAL_TOKEN_ATTRS:
                raise ValueError(
                    f"{source}: special token name {attr!r} (valid: {', '.join(SPECIAL_TOKEN_ATTRS)})"
                )
        self._ids: dict[str, int] = {}
        for attr, text in self._special.items():
            i = backend.token_to_id(text)
            if i is None:
                raise ValueError(f"{source}: {attr}={text!r} is not in the vocabulary")
            self._ids[attr] = i
        if "eos_token" not in self._ids:
            raise ValueError(
                f"{source}: no eos token (set eos_token in tokenizer_config.json, eos_token_id in "
                "generation_config.json / config.json, or tokenizer.ggml.eos_token_id in a GGUF)"
            )
        self._chat_template = chat_template
        eos = [self._ids["eos_token"], *map(int, extra_eos_ids)]
        eos += [i for i in map(backend.token_to_id, _EOG_TOKENS) if i is not None]
        n = self.vocab_size
        for i in eos:
            if not 0 <= i < n:
                raise ValueError(f"{source}: end-of-generation id {i} is outside the vocabulary [0, {n})")
        self._eos_ids = tuple(dict.fromkeys(eos))

    # -- construction ------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> HFTokenizer:
        """From a directory holding tokenizer.json (as transformers / tokenizers save it)."""
        from tokenizers import Tokenizer as Backend

        path = os.fspath(path)
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            raise FileNotFoundError(f"{path}: no tokenizer.json (valid: a directory with tokenizer.json)")
        try:
            backend = Backend.from_file(tj)
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            raise ValueError(f"{tj}: not a valid tokenizer.json ({e})") from None

        def read(name) -> dict:
            p = os.path.join(path, name)
            if not os.path.isfile(p):
                return {}
            with open(p, encoding="utf-8") as f:
                try:
                    data = json.load(f)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}: invalid JSON ({e})") from None
            if not isinstance(data, dict):
                raise ValueError(f"{p}: expected a JSON object, got {type(data).__name__}")
            return data

        config, smap = read("tokenizer_config.json"), read("special_tokens_map.json")
        gen, model_cfg = read("generation_config.json"), read("config.json")
        special: dict[str, str] = {}
        for attr in SPECIAL_TOKEN_ATTRS:
            value = config.get(attr) if config.get(attr) is not None else smap.get(attr)
            try:
                value = _token_content(value)
            except ValueError as e:
                raise ValueError(
                    f"{path}: tokenizer_config.json / special_tokens_map.json {attr}: {e}"
                ) from None
            if value is not None:
                special[attr] = value

        def ids_of(cfg: dict, name: str) -> list[int]:
            v = cfg.get("eos_token_id")
            if v is None:
                return []
            vals = v if isinstance(v, list) else [v]
            if not all(isinstance(x, int) for x in vals):
                raise ValueError(
                    f"{os.path.join(path, name)}: eos_token_id={v!r} (valid: an int or list of ints)"
                )
            return vals

        extra = ids_of(gen, "generation_config.json") + ids_of(model_cfg, "config.json")
        if "eos_token" not in special and extra:
            tok = backend.id_to_token(extra[0])
            if tok is not None:
                special["eos_token"] = tok
        jinja_file = os.path.join(path, "chat_template.jinja")
        template: Any
        if os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                template = f.read()
            where = jinja_file
        else:
            template = config.get("chat_template")
            where = f"{os.path.join(path, 'tokenizer_config.json')}: chat_template"
            if template is None:
                template = read("chat_template.json").get("chat_template")
                where = f"{os.path.join(path, 'chat_template.json')}: chat_template"
            if isinstance(template, list):
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
                if "default" not in named:
                    raise ValueError(
                        f"{path}: tokenizer_config.json chat_template lists {sorted(map(str, named))} but no "
                        "'default' template"
                    )
                template = named["default"]
            if template is not None and not isinstance(template, str):
                raise ValueError(f"{where} is {type(template).__name__} (valid: a string)")
        _check_template(template, where)
        return cls(backend, special_tokens=special, chat_template=template, extra_eos_ids=extra, source=path)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, pre_tokenizer: str = "transformers") -> HFTokenizer:
        """Rebuilt from a GGUF's `tokenizer.*` metadata (byte-level BPE, `tokenizer.ggml.model == "gpt2"`);
        `pre_tokenizer` as in `build_gguf_backend`."""
        from grpo_jax.tokenization.gguf_file import field_value, open_gguf

        path = os.fspath(path)
        reader = open_gguf(path)
        meta = {k: field_value(reader, k) for k in reader.fields if k.startswith("tokenizer.")}
        try:
            backend = build_gguf_backend(meta, path, pre_tokenizer)
        except (TypeError, AttributeError) as e:  # a metadata value of an unexpected type
            raise ValueError(f"{path}: malformed tokenizer.* metadata ({type(e).__name__}: {e})") from None
        tokens = meta["tokenizer.ggml.tokens"]
        special: dict[str, str] = {}
        for attr, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
        ):
            i = meta.get(f"tokenizer.ggml.{key}")
            if i is None:
                continue
            if not 0 <= int(i) < len(tokens):
                raise ValueError(f"{path}: tokenizer.ggml.{key}={i} is outside the {len(tokens)} tokens")
            special[attr] = tokens[int(i)]
        extra = [
            int(meta[k]) for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in meta
        ]
        template = meta.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise ValueError(
                f"{path}: tokenizer.chat_template is {type(template).__name__} (valid: a string)"
            )
        _check_template(template, f"{path}: tokenizer.chat_template")
        return cls(backend, special_tokens=special, chat_template=template, extra_eos_ids=extra, source=path)

    # -- the interface -----------------------------------------------------------------------------------

    @property
    def backend(self):
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens(self) -> dict[str, str]:
        return dict(self._special)

    @property
    def eos_id(self) -> int:
        return self._ids["eos_token"]

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos_ids

    @property
    def pad_id(self) -> int:
        return self._ids.get("pad_token", self._ids["eos_token"])

    @property
    def bos_id(self) -> int | None:
        return self._ids.get("bos_token")

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of `text`. Special-token strings in the text become their ids (transformers' default);
        add_special_tokens applies the post-processor (e.g. a BOS for Llama-3 files; nothing for SmolLM2)."""
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        n = self.vocab_size
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"token id {i} out of range [0, {n})")
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        if self._chat_template is None:
            raise ValueError(
                f"{self._source}: this tokenizer has no chat template (tokenizer_config.json chat_template, "
                "chat_template.jinja or GGUF tokenizer.chat_template); encode plain text instead"
            )
        return render_chat_template(
            self._chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self._special,
        )

    def fingerprint(self) -> str:
        """sha256 of the canonical tokenizer.json (vocab, merges, added tokens, pre-tokenizer, ...), the
        special tokens, the end-of-generation ids and the chat template."""
        payload = {
            "tokenizer": json.loads(self._tok.to_str()),
            "special": self._special,
            "eos_ids": list(self._eos_ids),
            "chat_template": self._chat_template,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def save(self, path: str | os.PathLike) -> None:
        write_tokenizer_dir(path, self._tok, self._special, self._chat_template)

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(source={self._source!r}, vocab_size={self.vocab_size}, eos_ids={self._eos_ids}, "
            f"chat_template={'yes' if self._chat_template else 'no'})"
        )


PRE_TOKENIZER_SOURCES = ("transformers", "llama.cpp")


def build_gguf_backend(meta: Mapping[str, Any], path: str = "<gguf>", pre_tokenizer: str = "transformers"):
    """The `tokenizers.Tokenizer` a GGUF's `tokenizer.*` metadata describes (see the module docstring).
    pre_tokenizer: "transformers" (its GGUF conversion: the digit-splitting rules of llama.cpp become GPT-2's
    plain split) or "llama.cpp" (llama.cpp's split rules, = the original tokenizer.json for SmolLM2)."""
    if pre_tokenizer not in PRE_TOKENIZER_SOURCES:
        raise ValueError(f"pre_tokenizer={pre_tokenizer!r}: valid: {', '.join(PRE_TOKENIZER_SOURCES)}")
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as Backend

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{path}: tokenizer.ggml.model={kind!r} is not supported (valid: 'gpt2', byte-level BPE; "
            "sentencepiece 'llama' vocabularies are not rebuilt here)"
        )
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    merges: list[str] = meta.get("tokenizer.ggml.merges") or []
    for key, value in (("tokens", tokens), ("merges", merges)):
        if not value:
            raise ValueError(
                f"{path}: tokenizer.ggml.{key} is missing or empty (required for byte-level BPE)"
            )
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"{path}: tokenizer.ggml.pre={pre!r} is not supported "
            f"(valid: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(
            f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
        )

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        key = tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8"))
        if key in vocab:
            raise ValueError(f"{path}: tokenizer.ggml.tokens[{i}]={tok!r} duplicates token {vocab[key]}")
        vocab[key] = i
    pairs = []
    for n, m in enumerate(merges):
        parts = m.split(" ")
        if len(parts) != 2:
            raise ValueError(
                f"{path}: tokenizer.ggml.merges[{n}]={m!r} (valid: two tokens separated by one space)"
            )
        pairs.append((parts[0], parts[1]))
    try:
        backend = Backend(
            models.BPE(
                vocab=vocab,
                merges=pairs,
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
            )
        )
    except (
        Exception
    ) as e:  # tokenizers raises a bare Exception (e.g. a merge of tokens not in the vocabulary)
        raise ValueError(f"{path}: tokenizer.ggml.tokens / merges are not a BPE vocabulary ({e})") from None
    rule = _PRE_TOKENIZERS[pre]
    if rule == "digits+gpt2" and pre_tokenizer == "transformers":
        rule = "gpt2"  # transformers' GGUF converter has no digit split for these (module docstring)
    if rule == "gpt2":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif rule == "digits+gpt2":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(rule.removeprefix("split:")), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == 3
        and set(t) <= alphabet  # 3 = CONTROL; others are llama.cpp mislabels (transformers skips them)
    ]
    if control:
        backend.add_special_tokens(control)
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == 4 and t in vocab  # 4 = USER_DEFINED: matched whole in text, not special
    ]
    if user:
        backend.add_tokens(user)

    # add_bos_token / add_eos_token -> "<bos> $A <eos>" (pair: the same around $B with type id 1)
    bos: list[str] = []
    eos: list[str] = []
    specials: list[tuple[str, int]] = []
    for flag, key, part in (("add_bos_token", "bos_token_id", bos), ("add_eos_token", "eos_token_id", eos)):
        if meta.get(f"tokenizer.ggml.{flag}") and meta.get(f"tokenizer.ggml.{key}") is not None:
            i = int(meta[f"tokenizer.ggml.{key}"])
            part.append(tokens[i])
            specials.append((tokens[i], i))
    single = [*bos, "$A", *eos]
    pair = [*single, *(t + ":1" for t in bos), "$B:1", *(t + ":1" for t in eos)]
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    return backend


def write_tokenizer_dir(
    path: str | os.PathLike,
    backend,
    special_tokens: Mapping[str, str],
    chat_template: str | None,
    extra_config: Mapping[str, Any] | None = None,
) -> None:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json (and chat_template.jinja) into
    `path` in the layout transformers' AutoTokenizer reads (tokenizer_class PreTrainedTokenizerFast = the
    generic tokenizer.json-backed class in transformers 4 and 5)."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    jinja_file = os.path.join(path, "chat_template.jinja")
    if chat_template is None and os.path.exists(jinja_file):
        raise ValueError(
            f"{jinja_file} exists but this tokenizer has no chat template: transformers would load the stale "
            "template; save into an empty directory or remove it"
        )
    backend.save(os.path.join(path, "tokenizer.json"))
    special = {k: v for k, v in special_tokens.items() if v is not None}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        **special,
        **(extra_config or {}),
    }
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(backend.get_added_tokens_decoder().items())
    }
    if added:
        config["added_tokens_decoder"] = added
    if chat_template is not None:
        config["chat_template"] = chat_template
        with open(jinja_file, "w", encoding="utf-8") as f:
            f.write(chat_template)
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(path, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2, ensure_ascii=False)
        f.write("\n")
