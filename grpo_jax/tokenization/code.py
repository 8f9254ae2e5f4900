"""A fixed, deterministic code tokenizer for the procedural suite (round-trips any Unicode string).

Vocabulary (ids are stable: nothing is learned at runtime):

    0 .. 7            special tokens: <pad>=0, <bos>=1, <eos>=2, <r3> .. <r7> reserved
    8 .. 263          the 256 single bytes (byte-level fallback: any UTF-8 text is encodable)
    264 .. V-1        `PIECES`: multi-character strings common in the suite's prompts and solutions
                      (indentation, keywords with their spaces, doctest markers, operators with spaces,
                      the description templates' words, idioms such as " for v in ")

Conventions: description words carry a leading space (" plus", " the"), code operators carry both spaces
(" + ", " == "), and argument names ("x", "xs", "text") have no piece with a space, so a name is the same
token in the description, the signature and the body. Measured on the suite: ≈ 3.1 characters per token;
prompts ≤ 43 tokens at levels 0-1 and ≤ 111 at levels 2-4, bodies ≤ 18 tokens (+1 EOS).

Encoding is greedy longest match over the UTF-8 bytes of the text (a regex alternation sorted longest
first, so the longest piece matching at each position wins; otherwise a single byte). Digits are never
merged (no piece contains a digit), so numbers are spelled digit by digit. Plain-text encoding never
produces a special id. `decode(encode(t)) == t` for every `str` without lone surrogates; arbitrary id
sequences decode with errors="replace".

`VOCAB_SIZE` == 512 (8 specials + 256 bytes + 248 pieces); `fingerprint()` hashes the whole vocabulary
for checkpoints.

It satisfies the trainer's tokenizer interface (`grpo_jax.tokenization.base.Tokenizer`): `eos_ids` = (EOS,),
`bos_id`, `chat_template` = None (`apply_chat_template` raises: prompts are plain text), `encode(text,
add_special_tokens=True)` prepends BOS, and `save(dir)` writes a tokenizer.json that transformers'
AutoTokenizer loads with the same ids (`save_code_tokenizer` below).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np

from grpo_jax.tokenization.hf import bytes_to_unicode, write_tokenizer_dir

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<r3>", "<r4>", "<r5>", "<r6>", "<r7>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
NUM_SPECIAL = len(SPECIAL_TOKENS)
BYTE_OFFSET = NUM_SPECIAL

# fmt: off
PIECES: tuple[str, ...] = (
    # layout: signature, docstring, doctest examples, body. "\n    >>> " and "\n    " start every example
    # and output line; '\n    """\n' closes the prompt; the body starts with "    return ".
    "def ", "):\n", '    """', '\n    """\n', "\n    >>> ", "\n    ", "    return ", "return ", "    ",
    ", ", "', '", "f(", "g(", "solve(", "])", "')", "['",
    # argument names, spelled without a space so they are the same token in the description and the code
    "xs", "nums", "arr", "text",
    # Python keywords, builtins and idioms of the reference solutions
    " for v in ", " for w in ", " if ", " else ", "True", "False", "None", "sum(", "len(", "max(", "min(",
    "abs(", "default=", ".split()", ".upper()", ".lower()", ".count(", ".replace(", ".join(",
    ".startswith(", ".endswith(", "[::-",
    # operators with their spaces
    " + ", " - ", " * ", " // ", " % ", " ** ", " == ", " != ", " > ", " < ", " <= ", " >= ", " = ",
    # the description templates' vocabulary: "Return" starts every description, other words carry a leading
    # space (punctuation and numbers are single bytes)
    "Return", " the", " of", " plus", " minus", " times", " divided", " by", " down", " remainder",
    " True", " is", " divisible", " greater", " than", " less", " larger", " smaller", " and",
    " squared", " positive", " absolute", " value", " even", " odd", " distance", " between",
    " sum", " squares", " how", " many", " numbers", " number", " in", " are", " with", " added", " to",
    " each", " appears", " largest", " smallest", " empty", " none", " reversed", " upper",
    " lower", " case", " words", " word", " joined", " first", " last", " characters", " repeated",
    " starts", " ends", " start", " replaced", " longer", " shorter", " letters", " letter",
    # after a comma ", " would take the space, so the words that follow one in a description get a piece
    ", each", ", else", ", or", ", rounded", ", all", ", joined",
    # the words of the string inputs, first in a sentence (no space) and after a space; upper case forms
    "an", "to", "it", "on", "up", "is", "cat", "dog", "sun", "sky", "red", "tea", "ant", "egg", "ice", "ink",
    "owl", "oak", "one", "net", "nut", "log", "tin", "tree", "blue", "moon", "star", "fish", "bird", "rain",
    "note", "lion", "salt", "iron", "rose", "lake", "east", "apple", "river", "green", "stone", "light",
    "train", "ocean", "table",
    " an", " it", " on", " up", " cat", " dog", " sun", " sky", " red", " tea", " ant", " egg", " ice",
    " ink", " owl", " oak", " one", " net", " nut", " log", " tin", " tree", " blue", " moon", " star",
    " fish", " bird", " rain", " note", " lion", " salt", " iron", " rose", " lake", " east", " apple",
    " river", " green", " stone", " light", " train", " ocean", " table",
    "TREE", "BLUE", "MOON", "STAR", "FISH", "BIRD", "RAIN", "NOTE", "LION", "SALT", "IRON", "ROSE", "LAKE",
    "EAST", "APPLE", "RIVER", "GREEN", "STONE", "LIGHT", "TRAIN", "OCEAN", "TABLE", "CAT", "DOG", "SUN",
    "SKY", "RED", "TEA", "ANT", "EGG", "ICE", "INK", "OWL", "OAK",
    # " if " (an operator piece) takes the space before the word that follows it in "if there is none"
    "there",
)
# fmt: on

VOCAB_SIZE = NUM_SPECIAL + 256 + len(PIECES)


def _validate_pieces(pieces: Sequence[str]) -> None:
    if len(set(pieces)) != len(pieces):
        dup = sorted({p for p in pieces if pieces.count(p) > 1})
        raise ValueError(f"tokenizer PIECES has duplicates: {dup}")
    for p in pieces:
        if len(p.encode("utf-8")) < 2:
            raise ValueError(
                f"tokenizer piece {p!r} must be at least two bytes (single bytes are byte tokens)"
            )
        if any(ch.isdigit() for ch in p):
            raise ValueError(f"tokenizer piece {p!r} contains a digit (digits stay single tokens)")


_validate_pieces(PIECES)


class CodeTokenizer:
    """Greedy longest-match byte-level tokenizer over a fixed piece list. See the module docstring."""

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    eos_ids: tuple[int, ...] = (EOS_ID,)
    chat_template: str | None = None

    def __init__(self) -> None:
        self._id_bytes: list[bytes] = [s.encode() for s in SPECIAL_TOKENS]  # specials: never emitted as text
        self._id_bytes += [bytes([b]) for b in range(256)]
        self._id_bytes += [p.encode("utf-8") for p in PIECES]
        self._is_special = np.zeros(VOCAB_SIZE, dtype=bool)
        self._is_special[:NUM_SPECIAL] = True
        self._lookup: dict[bytes, int] = {bytes([b]): BYTE_OFFSET + b for b in range(256)}
        for i, p in enumerate(PIECES):
            self._lookup[p.encode("utf-8")] = BYTE_OFFSET + 256 + i
        ordered = sorted((p.encode("utf-8") for p in PIECES), key=lambda b: (-len(b), b))
        self._pattern = re.compile(b"|".join(re.escape(b) for b in ordered) + b"|.", re.DOTALL)

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def encode(
        self, text: str, add_special_tokens: bool = False, *, bos: bool = False, eos: bool = False
    ) -> list[int]:
        """Ids of `text` (no special ids); BOS first if `bos` or `add_special_tokens`; EOS last if `eos`."""
        bos = bos or add_special_tokens
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"cannot tokenize text with a lone surrogate at position {e.start}") from e
        lookup = self._lookup
        ids = [lookup[m] for m in self._pattern.findall(data)]
        if bos:
            ids.insert(0, BOS_ID)
        if eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of `ids`. Specials are dropped (or spelled as "<eos>" etc. if skip_special=False); nothing
        stops at EOS. Invalid UTF-8 byte sequences decode with errors="replace"."""
        parts: list[bytes] = []
        for i in ids:
            i = int(i)
            if not 0 <= i < VOCAB_SIZE:
                raise ValueError(f"token id {i} out of range [0, {VOCAB_SIZE})")
            if i < NUM_SPECIAL and skip_special:
                continue
            parts.append(self._id_bytes[i])
        return b"".join(parts).decode("utf-8", errors="replace")

    def token_to_str(self, token_id: int) -> str:
        """A readable form of one token (for debugging): specials by name, bytes that are not valid UTF-8
        on their own as <0xNN>, pieces as text."""
        token_id = int(token_id)
        if not 0 <= token_id < VOCAB_SIZE:
            raise ValueError(f"token id {token_id} out of range [0, {VOCAB_SIZE})")
        if token_id < NUM_SPECIAL:
            return SPECIAL_TOKENS[token_id]
        raw = self._id_bytes[token_id]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return f"<0x{raw[0]:02X}>"

    def tokens(self, text: str) -> list[str]:
        """`token_to_str` of each token of `encode(text)` (for debugging)."""
        return [self.token_to_str(i) for i in self.encode(text)]

    def encode_batch(
        self,
        texts: Sequence[str],
        max_len: int,
        *,
        pad_left: bool,
        bos: bool = False,
        eos: bool = False,
        truncate: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encode and pad to `[N, max_len]` int32 ids and an int32 mask (1 on real tokens).

        `pad_left=True` (prompts) puts the padding first so every prompt ends at column max_len-1. A text
        longer than max_len raises ValueError naming it, unless `truncate=True`, which keeps the LAST
        max_len tokens when padding left (the part nearest the completion) and the first ones otherwise.
        """
        if max_len <= 0:
            raise ValueError(f"encode_batch: max_len={max_len} must be positive")
        ids = np.full((len(texts), max_len), PAD_ID, dtype=np.int32)
        mask = np.zeros((len(texts), max_len), dtype=np.int32)
        for n, text in enumerate(texts):
            row = self.encode(text, bos=bos, eos=eos)
            if len(row) > max_len:
                if not truncate:
                    raise ValueError(
                        f"encode_batch: text {n} has {len(row)} tokens, more than max_len={max_len} "
                        "(raise max_len or pass truncate=True)"
                    )
                row = row[-max_len:] if pad_left else row[:max_len]
            if pad_left:
                ids[n, max_len - len(row) :] = row
                mask[n, max_len - len(row) :] = 1
            else:
                ids[n, : len(row)] = row
                mask[n, : len(row)] = 1
        return ids, mask

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        raise ValueError(
            "CodeTokenizer has no chat template (the procedural suite prompts with plain text): encode the "
            "prompt directly, or use a real tokenizer (grpo_jax.tokenization.load_tokenizer)"
        )

    def save(self, path) -> None:
        """Write tokenizer.json / tokenizer_config.json / special_tokens_map.json for transformers'
        AutoTokenizer (same ids for any text that does not spell a special token like "<eos>" literally)."""
        save_code_tokenizer(self, path)

    def fingerprint(self) -> str:
        """sha256 of the whole vocabulary (specials, bytes, pieces, in id order); store it in checkpoints."""
        h = hashlib.sha256()
        for i, raw in enumerate(self._id_bytes):
            h.update(f"{i}:{int(self._is_special[i])}:{len(raw)}:".encode() + raw)
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"CodeTokenizer(vocab_size={VOCAB_SIZE}, fingerprint={self.fingerprint()[:12]})"


def fingerprint() -> str:
    return CodeTokenizer().fingerprint()


CODE_MARKER = "grpo_jax_code_tokenizer"  # tokenizer_config.json key: the CodeTokenizer fingerprint


def _onig_escape(text: str) -> str:
    """`text` as a literal in a tokenizers (Oniguruma) regex: letters and digits as is, the rest as \\x{H}."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


def code_tokenizer_backend(tok=None):
    """The procedural CodeTokenizer (this module's CodeTokenizer) as an equivalent `tokenizers.Tokenizer`.

    CodeTokenizer is greedy longest match over UTF-8 bytes (a regex alternation of its pieces, longest first,
    then any single byte). Here: a Split pre-tokenizer with the same alternation (Oniguruma's alternation is
    ordered like Python's re, so each match is the longest piece at that position, else one character), a
    ByteLevel step that spells each split in GPT-2's byte alphabet, and a WordPiece model (greedy longest
    match, no continuation prefix) over the 512 entries spelled the same way, which turns a piece into its id
    and a lone character into its byte ids. Specials are added tokens (so transformers knows pad/bos/eos),
    which means a text that literally spells "<eos>" encodes to the special id in transformers but to bytes in
    CodeTokenizer; every other text gets identical ids (tested on the task suite and random Unicode)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as Backend

    tok = tok or CodeTokenizer()
    spelling = bytes_to_unicode()
    vocab = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
    for b in range(256):
        vocab[spelling[b]] = BYTE_OFFSET + b
    for i, piece in enumerate(PIECES):
        vocab["".join(spelling[b] for b in piece.encode("utf-8"))] = BYTE_OFFSET + 256 + i
    if len(vocab) != VOCAB_SIZE:
        raise ValueError(f"code_tokenizer_backend: {len(vocab)} distinct entries for {VOCAB_SIZE} ids")
    longest = max(len(p.encode("utf-8")) for p in PIECES)
    backend = Backend(
        models.WordPiece(
            vocab,
            unk_token=SPECIAL_TOKENS[-1],
            continuing_subword_prefix="",
            max_input_chars_per_word=longest,
        )
    )
    ordered = sorted(PIECES, key=lambda p: (-len(p.encode("utf-8")), p.encode("utf-8")))
    pattern = "|".join(_onig_escape(p) for p in ordered) + r"|[\s\S]"
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    bos = SPECIAL_TOKENS[BOS_ID]
    backend.post_processor = processors.TemplateProcessing(
        single=[bos, "$A"], pair=[bos, "$A", bos + ":1", "$B:1"], special_tokens=[(bos, BOS_ID)]
    )
    return backend


def save_code_tokenizer(tok, path: str | os.PathLike) -> None:
    """CodeTokenizer.save: the equivalent tokenizer.json (code_tokenizer_backend) plus its configs; the
    fingerprint is recorded so `load_tokenizer(path)` returns the (faster) CodeTokenizer itself."""
    special = {
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "pad_token": SPECIAL_TOKENS[PAD_ID],
    }
    write_tokenizer_dir(path, code_tokenizer_backend(tok), special, None, {CODE_MARKER: tok.fingerprint()})
