"""Tests for the code tokenizer (grpo_jax/tokenization/code.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from grpo_jax.codegen import tasks
from grpo_jax.tokenization import code as tk

TOK = tk.CodeTokenizer()


def _suite_texts():
    problems = tasks.make_split("train", n_per_level=120) + tasks.make_split("heldout", n_per_level=40)
    return problems


def _naive_encode(text: str) -> list[int]:
    """Reference greedy longest match with a dict, to check the regex implementation."""
    table = {p.encode(): tk.BYTE_OFFSET + 256 + i for i, p in enumerate(tk.PIECES)}
    longest = max(len(k) for k in table)
    data, out, i = text.encode(), [], 0
    while i < len(data):
        for n in range(min(longest, len(data) - i), 1, -1):
            if data[i : i + n] in table:
                out.append(table[data[i : i + n]])
                i += n
                break
        else:
            out.append(tk.BYTE_OFFSET + data[i])
            i += 1
    return out


def test_vocab_layout():
    assert TOK.vocab_size == tk.VOCAB_SIZE == 512
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (0, 1, 2)
    assert TOK.token_to_str(0) == "<pad>" and TOK.token_to_str(2) == "<eos>"
    assert TOK.token_to_str(tk.BYTE_OFFSET + ord("a")) == "a"
    assert TOK.token_to_str(tk.BYTE_OFFSET + 0xFF) == "<0xFF>"
    assert TOK.token_to_str(tk.BYTE_OFFSET + 256) == tk.PIECES[0]
    assert len(set(tk.PIECES)) == len(tk.PIECES)
    assert not any(ch.isdigit() for p in tk.PIECES for ch in p)


def test_fingerprint_stable():
    assert TOK.fingerprint() == tk.CodeTokenizer().fingerprint() == tk.fingerprint()
    assert len(TOK.fingerprint()) == 64


def test_round_trip_suite_and_compression():
    chars = tokens = 0
    for p in _suite_texts():
        for text in (p.prompt, p.reference, tasks.reference_body(p)):
            ids = TOK.encode(text)
            assert TOK.decode(ids) == text
            assert all(tk.NUM_SPECIAL <= i < tk.VOCAB_SIZE for i in ids)
        ids = TOK.encode(p.reference)
        chars += len(p.reference)
        tokens += len(ids)
        assert ids == _naive_encode(p.reference)
    # measured ≈ 3.1 chars/token over prompt + reference
    assert chars / tokens > 2.6


def test_round_trip_random_unicode():
    rng = random.Random(0)
    pool = [chr(c) for c in range(0, 0x250)] + list("😀🐍漢字ß\u0301\u200b\ufeff\x00\n\t ") + list(tk.PIECES)
    for _ in range(300):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
        ids = TOK.encode(text)
        assert TOK.decode(ids) == text
        assert all(tk.NUM_SPECIAL <= i < tk.VOCAB_SIZE for i in ids)
        assert ids == _naive_encode(text)
    for _ in range(200):  # any code point except surrogates
        cps = [rng.randrange(0x110000) for _ in range(rng.randint(1, 10))]
        text = "".join(chr(c) for c in cps if not 0xD800 <= c < 0xE000)
        assert TOK.decode(TOK.encode(text)) == text
    assert TOK.encode("") == [] and TOK.decode([]) == ""
    with pytest.raises(ValueError, match="surrogate"):
        TOK.encode("a\ud800b")


def test_specials():
    ids = TOK.encode("def f(x):", bos=True, eos=True)
    assert ids[0] == TOK.bos_id and ids[-1] == TOK.eos_id
    assert TOK.decode(ids) == "def f(x):"
    assert TOK.decode(ids, skip_special=False) == "<bos>def f(x):<eos>"
    assert not {0, 1, 2} & set(TOK.encode("<pad><bos><eos>"))
    # decode does not stop at EOS; invalid UTF-8 becomes U+FFFD
    assert TOK.decode([tk.BYTE_OFFSET + ord("a"), TOK.eos_id, tk.BYTE_OFFSET + ord("b")]) == "ab"
    assert TOK.decode([tk.BYTE_OFFSET + 0xC3]) == "\ufffd"
    with pytest.raises(ValueError, match="out of range"):
        TOK.decode([tk.VOCAB_SIZE])


def test_pieces_used_on_suite():
    # "|" separates the expected tokens (no piece contains "|").
    toks = TOK.tokens('    """Return x plus 3.\n    >>> f(1, 2)\n')
    assert toks == '    """|Return| |x| plus| |3|.|\n    >>> |f(|1|, |2|)|\n'.split("|")
    toks = TOK.tokens("    return [v + 2 for v in xs]\n")
    assert toks == "    return |[|v| + |2| for v in |xs|]|\n".split("|")


def test_encode_batch():
    texts = ["def f(x):", "", "return x + 10 - y"]
    ids, mask = TOK.encode_batch(texts, 9, pad_left=True)
    assert ids.dtype == np.int32 and mask.dtype == np.int32 and ids.shape == mask.shape == (3, 9)
    for n, text in enumerate(texts):
        row = TOK.encode(text)
        assert ids[n, 9 - len(row) :].tolist() == row
        assert mask[n].tolist() == [0] * (9 - len(row)) + [1] * len(row)
        assert (ids[n, : 9 - len(row)] == TOK.pad_id).all()
        assert TOK.decode(ids[n]) == text
    ids_r, mask_r = TOK.encode_batch(texts, 9, pad_left=False, eos=True)
    row = TOK.encode(texts[2], eos=True)
    assert ids_r[2, : len(row)].tolist() == row
    assert mask_r[2].tolist() == [1] * len(row) + [0] * (9 - len(row))
    with pytest.raises(ValueError, match=r"text 2 has 7 tokens, more than max_len=6"):
        TOK.encode_batch(texts, 6, pad_left=True)
    full = TOK.encode(texts[2])
    ids_t, mask_t = TOK.encode_batch(texts, 6, pad_left=True, truncate=True)
    assert ids_t[2].tolist() == full[-6:] and mask_t[2].tolist() == [1] * 6
    ids_t, _ = TOK.encode_batch(texts, 6, pad_left=False, truncate=True)
    assert ids_t[2].tolist() == full[:6]


def test_trainer_interface(tmp_path):
    """CodeTokenizer satisfies grpo_jax.tokenization.Tokenizer without changing any id."""
    from grpo_jax.tokenization import Tokenizer, load_tokenizer

    assert isinstance(TOK, Tokenizer)
    assert TOK.eos_ids == (TOK.eos_id,) == (2,) and TOK.bos_id == 1 and TOK.chat_template is None
    assert TOK.encode("def f(x):", add_special_tokens=True) == [TOK.bos_id, *TOK.encode("def f(x):")]
    assert TOK.encode("def f(x):", add_special_tokens=True) == TOK.encode("def f(x):", bos=True)
    with pytest.raises(ValueError, match="CodeTokenizer has no chat template"):
        TOK.apply_chat_template([{"role": "user", "content": "hi"}])
    pytest.importorskip("tokenizers")  # save() writes a tokenizer.json with the `tokenizers` library
    TOK.save(tmp_path)
    back = load_tokenizer(tmp_path)
    assert type(back) is tk.CodeTokenizer and back.fingerprint() == TOK.fingerprint()
