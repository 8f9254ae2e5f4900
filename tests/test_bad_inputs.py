"""A bad input FILE of the main job (an --init_from Hugging Face directory or GGUF file, tokenizer files, the
chat template) is one line naming the file and what is wrong, exit status 2, nothing written to the
workdir (WORKSPACE.md §2). The loaders raise ValueError / OSError naming the file; the run's loading phase
(grpo_jax.train.build.model_and_tokenizer, check_chat_template) turns them into one RunConfigError, which
experiments/codegen.py prints as `error: ...` before the workdir exists. In-process through the loading
phase, plus one subprocess run of the real `python -m experiments.codegen` on a truncated safetensors file.
(Bad flagfiles and sweep grids: tests/test_config.py and tests/test_sweep.py.)"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import struct

import jax
import numpy as np
import pytest
from mainjob import config, subprocess_run
from test_gguf import _tiny_cfg, _tiny_params, _write_gguf

import grpo_jax
from grpo_jax.codegen import tasks
from grpo_jax.policies.transformer import TransformerConfig, init_params
from grpo_jax.pretrained import safetensors_io
from grpo_jax.pretrained.gguf import read_config
from grpo_jax.tokenization import CodeTokenizer
from grpo_jax.tokenization.gguf_file import read_gguf
from grpo_jax.train import build
from grpo_jax.train.build import RunConfigError

ST = "model.safetensors"
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A tiny valid HF directory (the procedural tokenizer's 512 ids) written by grpo_jax.save_pretrained."""
    tok = CodeTokenizer()
    cfg = TransformerConfig(
        vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32
    )
    path = tmp_path_factory.mktemp("hf") / "good"
    return str(grpo_jax.save_pretrained(str(path), cfg, init_params(cfg, jax.random.key(0)), tokenizer=tok))


def _copy(good, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(good, d)
    return d


def _header(d):
    raw = (d / ST).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write_header(d, header, data):
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (d / ST).write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _edit_json(file, fn):
    file.write_text(json.dumps(fn(json.loads(file.read_text()))))


def _hf_tokenizer(d):
    """The directory's tokenizer as a plain HF one (no CodeTokenizer marker), so tokenizer.json is read."""
    _edit_json(
        d / "tokenizer_config.json", lambda c: {k: v for k, v in c.items() if not k.startswith("grpo")}
    )


def _truncate(d):
    raw = (d / ST).read_bytes()
    (d / ST).write_bytes(raw[: len(raw) // 2])


def _truncate_header(d):
    raw = (d / ST).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    (d / ST).write_bytes(raw[: 8 + n // 2])


def _garbage_header(d):
    raw = (d / ST).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    (d / ST).write_bytes(raw[:8] + b"\xff" * n + raw[8 + n :])


def _header_edit(fn):
    def edit(d):
        h, data = _header(d)
        _write_header(d, fn(h), data)

    return edit


def _entry(key, value):
    def fn(h):
        if value is None:
            del h["model.norm.weight"][key]
        else:
            h["model.norm.weight"][key] = value
        return h

    return _header_edit(fn)


def _wrong_shape(h):
    b, e = h["model.norm.weight"]["data_offsets"]
    h["model.norm.weight"]["shape"] = [(e - b) // 8, 2]
    return h


def _missing_shard(d):
    tensors = safetensors_io.read(str(d / ST))
    names = sorted(tensors)
    shards = {n: f"model-0000{1 + (i >= len(names) // 2)}-of-00002.safetensors" for i, n in enumerate(names)}
    first = {n: np.asarray(tensors[n]) for n in names if shards[n].startswith("model-00001")}
    safetensors_io.write(str(d / "model-00001-of-00002.safetensors"), first)
    (d / ST).unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))


def _index_not_json(d):
    (d / ST).unlink()
    (d / "model.safetensors.index.json").write_text("{oops")


def _config(fn):
    return lambda d: _edit_json(d / "config.json", fn)


def _set(key, value):
    return _config(lambda c: {**c, key: value})


def _chat_template(template):
    def edit(d):
        _hf_tokenizer(d)
        _edit_json(d / "tokenizer_config.json", lambda c: {**c, "chat_template": template})

    return edit


def _tokenizer_json(d):
    _hf_tokenizer(d)
    (d / "tokenizer.json").write_text("{not json")


# (fault, how to make it, the error line after "--init_from=DIR: "; DIR stands for the directory)
HF_FAULTS = [
    (
        "no config.json",
        lambda d: (d / "config.json").unlink(),
        r"DIR: no config\.json \(valid: a Hugging Face",
    ),
    (
        "config.json not JSON",
        lambda d: (d / "config.json").write_text("{x"),
        r"DIR/config\.json: not valid JSON",
    ),
    (
        "config.json a list",
        lambda d: (d / "config.json").write_text("[1]"),
        r"DIR/config\.json: a JSON list, not",
    ),
    (
        "no model_type",
        _config(lambda c: {k: v for k, v in c.items() if k != "model_type"}),
        r"DIR/config\.json: model_type=None: valid: llama, qwen2, qwen3",
    ),
    (
        "field of a wrong type",
        _set("hidden_size", "big"),
        r"DIR/config\.json: hidden_size='big': expected an int",
    ),
    (
        "field null",
        _set("num_hidden_layers", None),
        r"DIR/config\.json: num_hidden_layers=None: expected an int",
    ),
    ("truncated safetensors", _truncate, r"DIR/ST: tensor '.*' needs bytes \d+\.\.\d+ but .* \(truncated\)"),
    ("truncated header", _truncate_header, r"DIR/ST: header of \d+ bytes but the file ends .* \(truncated"),
    ("garbage header", _garbage_header, r"DIR/ST: header is not JSON .*not a safetensors file"),
    ("header a list", _header_edit(lambda h: [1]), r"DIR/ST: header is JSON list, not an object"),
    (
        "entry without offsets",
        _entry("data_offsets", None),
        r"DIR/ST: tensor 'NORM' has a malformed header entry",
    ),
    ("entry shape garbled", _entry("shape", "abc"), r"DIR/ST: tensor 'NORM' has a malformed header entry"),
    ("unreadable dtype", _entry("dtype", "F8_E4M3"), r"DIR/ST: tensor 'NORM' has dtype 'F8_E4M3'; readable"),
    ("integer tensor", _entry("dtype", "I32"), r"DIR: tensor 'NORM' has dtype int32 \(valid: float32"),
    (
        "wrong shape",
        _header_edit(_wrong_shape),
        r"DIR: tensor 'NORM' has shape \(8, 2\), config\.json implies",
    ),
    (
        "config's shape",
        _set("intermediate_size", 48),
        r"DIR: tensor '.*' has shape \(\d+, \d+\), config\.json",
    ),
    (
        "missing shard",
        _missing_shard,
        r"DIR/INDEX: shard 'model-00002-of-00002\.safetensors' is missing from DIR",
    ),
    ("index not JSON", _index_not_json, r"DIR/INDEX: not valid JSON"),
    ("tokenizer.json not JSON", _tokenizer_json, r"DIR/tokenizer\.json: not a valid tokenizer\.json"),
    (
        "tokenizer_config.json not JSON",
        lambda d: (d / "tokenizer_config.json").write_text("{x"),
        r"DIR/tokenizer_config\.json: invalid JSON",
    ),
    (
        "chat template syntax",
        _chat_template("{% for m in messages %}{{ m.content }"),
        r"DIR/tokenizer_config\.json: chat_template: not a valid Jinja template \(unexpected '}' at line 1\)",
    ),
    (
        "chat template not a string",
        _chat_template(5),
        r"DIR/tokenizer_config\.json: chat_template is int \(valid: a string\)",
    ),
]


def _load(*flags, workdir):
    cfg, _ = config(*flags, workdir=str(workdir))
    return build.model_and_tokenizer(cfg, print_fn=lambda _: None)


def _one_line_error(fn, pattern):
    with pytest.raises(RunConfigError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    assert re.fullmatch(pattern + ".*", msg), msg
    return msg


@pytest.mark.parametrize("fault,make,expect", HF_FAULTS, ids=[f[0] for f in HF_FAULTS])
def test_hf_directory_faults(good, tmp_path, fault, make, expect):
    d = _copy(good, tmp_path)
    make(d)
    for word, text in (("ST", ST), ("NORM", "model.norm.weight"), ("INDEX", INDEX), ("DIR", str(d))):
        expect = expect.replace(word, re.escape(text))
    pattern = re.escape(f"--init_from={d}: ") + expect
    _one_line_error(
        lambda: _load(f"--init_from={d}", "--prompt_format=plain", workdir=tmp_path / "wd"), pattern
    )
    assert not (tmp_path / "wd").exists()


def test_the_good_directory_loads(good, tmp_path):
    tok, model, params = _load(f"--init_from={good}", "--prompt_format=plain", workdir=tmp_path / "wd")
    assert model.d_model == 16 and params["embed"].shape == (512, 16) and tok.vocab_size == 512


def test_tokenizer_flag(good, tmp_path):
    d = _copy(good, tmp_path)
    _tokenizer_json(d)
    _one_line_error(
        lambda: _load(f"--tokenizer={d}", workdir=tmp_path / "wd"),
        rf"--tokenizer={d}: {d}/tokenizer\.json: not a valid tokenizer\.json",
    )


def test_chat_template_that_fails_on_a_prompt(good, tmp_path):
    """A template that compiles but raises on the run's prompts stops the run at set-up, not at the first
    evaluation (after the workdir and checkpoint 0 were written)."""
    d = _copy(good, tmp_path)
    _chat_template("{{ raise_exception('system messages are not supported') }}")(d)
    cfg, _ = config(f"--init_from={d}", "--prompt_format=chat", workdir=str(tmp_path / "wd"))
    tok, _, _ = build.model_and_tokenizer(cfg, print_fn=lambda _: None)
    rl = tasks.make_split("train", levels=(0,), n_per_level=1)
    problems = build.Problems([], rl, [], {})
    _one_line_error(
        lambda: build.check_chat_template(cfg, tok, problems),
        rf"--prompt_format=chat: the chat template of --init_from={d} does not render a prompt "
        r"\(TemplateError: system messages are not supported\)",
    )
    good_cfg = dataclasses.replace(cfg, tasks=dataclasses.replace(cfg.tasks, prompt_format="plain"))
    build.check_chat_template(good_cfg, tok, problems)  # plain prompts: the template is never rendered


# ----------------------------------------------------------------------------------------------------------
# GGUF


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    cfg = _tiny_cfg("qwen2")
    return _write_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", "qwen2", cfg, _tiny_params(cfg))


def test_gguf_faults(good, gguf_file, tmp_path):
    raw = open(gguf_file, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[: len(raw) // 2])
    _one_line_error(  # the tokenizer is read from the GGUF first
        lambda: _load(f"--init_from={cut}", "--prompt_format=plain", workdir=tmp_path / "wd"),
        rf"--init_from={cut}: {cut}: .*\(truncated",
    )
    # test_gguf's tiny files list a merge whose result is not a token: a vocabulary tokenizers refuses
    _one_line_error(
        lambda: _load(f"--init_from={gguf_file}", "--prompt_format=plain", workdir=tmp_path / "wd"),
        rf"--init_from={gguf_file}: {gguf_file}: tokenizer\.ggml\.tokens / merges are not a BPE vocabulary",
    )
    cfg = _tiny_cfg("llama")
    other = _write_gguf(tmp_path / "other.gguf", "gpt2", cfg, _tiny_params(cfg))
    _one_line_error(  # the model itself (the tokenizer from a good directory)
        lambda: _load(
            f"--init_from={other}", f"--tokenizer={good}", "--prompt_format=plain", workdir=tmp_path / "wd"
        ),
        rf"--init_from={other}: {other}: general\.architecture='gpt2' is not supported \(valid: llama",
    )
    assert not (tmp_path / "wd").exists()
    # metadata of the wrong type or describing no valid model: one ValueError naming the file and the field
    reader = read_gguf(gguf_file)
    for key, value, expect in (
        ("qwen2.block_count", "two", r"metadata field 'qwen2\.block_count'='two' \(valid: an integer\)"),
        (
            "qwen2.attention.layer_norm_rms_epsilon",
            [1],
            r"metadata field 'qwen2\.attention\.layer_norm_rms_epsilon'=\[1\] \(valid: a number\)",
        ),
        (
            "qwen2.attention.head_count",
            0,
            r"metadata field 'qwen2\.attention\.head_count'=0 \(valid: an integer > 0\)",
        ),
        ("qwen2.attention.head_count_kv", 3, r"the metadata describe no valid model \(.*n_kv_heads"),
    ):
        bad = dataclasses.replace(reader, fields={**reader.fields, key: value})
        with pytest.raises(ValueError, match=f"^{gguf_file}: {expect}"):
            read_config(bad, gguf_file)


# ----------------------------------------------------------------------------------------------------------
# the real main job: one line, exit status 2, no workdir


def test_main_job_truncated_safetensors(good, tmp_path):
    d = _copy(good, tmp_path)
    _truncate(d)
    wd = tmp_path / "wd"
    r = subprocess_run(f"--init_from={d}", "--prompt_format=plain", "--sandbox_workers=1", f"--workdir={wd}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: --init_from={d}: {d}/{ST}: tensor "), r.stderr
    assert "(truncated)" in lines[0]
    assert not wd.exists()
