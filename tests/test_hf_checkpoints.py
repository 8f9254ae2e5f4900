"""Hugging Face checkpoints in and out (grpo_jax.pretrained.hf): parity with transformers, the contract.

Every checkpoint is built here with transformers from a small random config (no hub), with EVERY weight
perturbed (biases non-zero, norm weights != 1), saved with save_pretrained, loaded with load_hf and run
through transformer.forward on left-padded sequences of > 500 tokens (short prompts miss RoPE bugs), compared
with transformers' float32 logits at the real positions (position_ids = max(cumsum(mask) - 1, 0) for HF).
Tolerance: max |delta| / max |logits| <= 2e-4 for the logits and the next-token log-probs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grpo_jax.policies import lora  # noqa: E402
from grpo_jax.policies import transformer as tfm  # noqa: E402
from grpo_jax.pretrained import hf as hfm  # noqa: E402
from grpo_jax.pretrained import safetensors_io  # noqa: E402

S, PAD = 520, 37  # sequence length; left padding of row 1
TOL = 2e-4
SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)

# name -> (transformers config class, model class, config kwargs, torch dtype, save_pretrained kwargs)
# llama3: original 32 with theta 1e4, Dh 16 puts the RoPE frequencies in all three branches of the formula
# (wavelength 6.3 < 32/4 kept, 19.9 smoothed, >= 63 > 32/1 divided by 8); sequences run to 520 >> 32.
CASES = {
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM",
                   dict(SMALL, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
                   torch.float32, {}),
    "qwen2_untied": ("Qwen2Config", "Qwen2ForCausalLM",
                     dict(SMALL, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                          tie_word_embeddings=False, rope_theta=1e6),
                     torch.float32, {}),
    "llama_gqa_head_dim": ("LlamaConfig", "LlamaForCausalLM",
                           dict(SMALL, num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                                attention_bias=True, rms_norm_eps=1e-5, rope_theta=1e5),
                           torch.float32, {}),
    "llama3_scaled": ("LlamaConfig", "LlamaForCausalLM",
                      dict(SMALL, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                           rope_parameters=dict(LLAMA3, rope_theta=1e4, original_max_position_embeddings=32)),
                      torch.float32, {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   tie_word_embeddings=True),
              torch.float32, {}),
    "qwen3_bias_bf16": ("Qwen3Config", "Qwen3ForCausalLM",
                        dict(SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             attention_bias=True),
                        torch.bfloat16, {}),
    "llama_sharded": ("LlamaConfig", "LlamaForCausalLM",
                      dict(SMALL, num_attention_heads=4, num_key_value_heads=2),
                      torch.float32, dict(max_shard_size="40KB")),
}  # fmt: skip


def _build(name: str, root) -> tuple:
    cfg_cls, model_cls, kw, tdtype, save_kw = CASES[name]
    torch.manual_seed(sum(map(ord, name)))
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).eval()
    with torch.no_grad():
        for p in model.parameters():  # every weight: biases non-zero, norm weights != 1
            p.add_(0.02 * torch.randn_like(p))
    model = model.to(tdtype)
    path = str(root / name)
    model.save_pretrained(path, **save_kw)
    return model, path


def _inputs(vocab: int):
    rng = np.random.default_rng(0)
    tok = rng.integers(0, vocab, (2, S))
    mask = np.ones((2, S), np.int64)
    mask[1, :PAD] = 0
    tok[1, :PAD] = 0
    return tok, mask


def _torch_logits(model, tok, mask, path=None) -> np.ndarray:
    """transformers' float32 logits. A bf16 model is re-read from its file `path` as float32 (casting the
    module instead would also round its rotary inv_freq buffer to bf16: ~1e-3 relative logit error)."""
    pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
    if model.dtype != torch.float32:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tok), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos)
        )
    return out.logits.float().numpy()


_FWD = jax.jit(lambda p, c, t, m: tfm.forward(p, c, t, m)[0], static_argnums=1)


def _rel(a: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(max |dlogit| / max |logit|, max |dlogp| / max |logit|) over real positions."""
    m = mask.astype(bool)
    scale = np.abs(ref[m]).max()
    lp_a = jax.nn.log_softmax(jnp.asarray(a), -1)
    lp_r = jax.nn.log_softmax(jnp.asarray(ref), -1)
    return float(np.abs(a - ref)[m].max() / scale), float(np.abs(np.asarray(lp_a - lp_r))[m].max() / scale)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (transformers model, checkpoint dir, torch logits [2, S, V], tokens, mask); each built once."""
    root = tmp_path_factory.mktemp("hf")
    cache: dict = {}

    def get(name):
        if name not in cache:
            model, path = _build(name, root)
            tok, mask = _inputs(model.config.vocab_size)
            cache[name] = (model, path, _torch_logits(model, tok, mask, path), tok, mask)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(built, name):
    model, path, ref, tok, mask = built(name)
    bf16 = CASES[name][3] == torch.bfloat16
    cfg, params = hfm.load_hf(path, dtype="float32" if bf16 else None)
    assert cfg.family == model.config.model_type and cfg.param_dtype == "float32"
    out = np.asarray(_FWD(params, cfg, jnp.asarray(tok), jnp.asarray(mask)))
    e_logit, e_logp = _rel(out, ref, mask)
    print(f"\n[parity] {name}: max|dlogit|/scale={e_logit:.2e} max|dlogp|/scale={e_logp:.2e}")
    assert e_logit <= TOL and e_logp <= TOL
    if bf16:  # dtype=None keeps the file's bfloat16
        cfg16, p16 = hfm.load_hf(path)
        assert cfg16.param_dtype == "bfloat16" and p16["embed"].dtype == jnp.bfloat16
        assert cfg16 == dataclasses.replace(cfg, param_dtype="bfloat16")
    if "sharded" in name:
        assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
        assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 1


def test_parity_test_sees_a_broken_model(built):
    """The contract test can fail: without the llama3 scaling or the q/k norm it misses by orders of
    magnitude."""
    for name, broken in (("llama3_scaled", dict(rope_scaling=None)), ("qwen3", dict(qk_norm=False))):
        _, path, ref, tok, mask = built(name)
        cfg, params = hfm.load_hf(path)
        cfg = dataclasses.replace(cfg, **broken, family=None)
        out = np.asarray(_FWD(params, cfg, jnp.asarray(tok), jnp.asarray(mask)))
        e_logit, _ = _rel(out, ref, mask)
        print(f"\n[broken] {name} with {broken}: max|dlogit|/scale={e_logit:.2e}")
        assert e_logit > 10 * TOL


@pytest.mark.parametrize("name", list(CASES))
def test_export_roundtrip(built, name, tmp_path):
    model, path, ref, tok, mask = built(name)
    cfg, params = hfm.load_hf(path)
    out = hfm.save_hf(str(tmp_path / "export"), cfg, params)
    back, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(back).__name__ == type(model).__name__
    assert back.dtype == model.dtype
    e_logit, e_logp = _rel(_torch_logits(back.eval(), tok, mask, out), ref, mask)
    print(f"\n[export] {name}: max|dlogit|/scale={e_logit:.2e} max|dlogp|/scale={e_logp:.2e}")
    assert e_logit <= TOL and e_logp <= TOL
    cfg2, params2 = hfm.load_hf(out)
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]  # no temp dir left


_PREFILL = jax.jit(tfm.prefill, static_argnums=(1, 4, 5))
_DECODE = jax.jit(tfm.decode_step, static_argnums=1)


def cached_decode_vs_forward(params, cfg, tok, mask, t: int) -> tuple[jax.Array, jax.Array]:
    """(decoded, ref) [B, t, V]: the logits of prefill on all but the last t tokens then t - 1 decode steps
    fed the true tokens, and the forward's logits at the same positions (predicting tokens S-t .. S-1)."""
    s = tok.shape[1]
    ref = _FWD(params, cfg, tok, mask)[:, s - t - 1 : s - 1]
    cache, lg = _PREFILL(params, cfg, tok[:, : s - t], mask[:, : s - t], 1, t)
    steps = [lg]
    for i in range(t - 1):
        cache, lg = _DECODE(params, cfg, cache, tok[:, None, s - t + i], jnp.int32(i))
        steps.append(lg[:, 0])
    return jnp.stack(steps, 1), ref


@pytest.mark.parametrize("name", ["qwen3", "llama3_scaled"])
def test_cached_decode_matches_forward(built, name):
    """The sampler's KV-cache path (prefill + decode_step) on a loaded checkpoint = forward, logits step by
    step, on the left-padded batch with positions up to 519 >> original_max_position_embeddings (32).
    (The sampler itself and forward_grouped with these options: tests/test_transformer.py.)"""
    _, path, _, tok, mask = built(name)
    cfg, params = hfm.load_hf(path)
    t = 8
    tok, mask = jnp.asarray(tok), jnp.asarray(mask)
    got, ref = cached_decode_vs_forward(params, cfg, tok, mask, t)
    np.testing.assert_allclose(got, ref, atol=2e-5 * float(jnp.abs(ref).max()), rtol=0)


# ----------------------------------------------------------------------------------------------------------
# config.json reading and refusals


def _cfg_json(built, name) -> dict:
    with open(os.path.join(built(name)[1], "config.json")) as fh:
        return json.load(fh)


def test_hub_style_config_reads_the_same(built):
    """Hub files carry top-level rope_theta / rope_scaling (old "type" key) and Qwen2 has no head_dim."""
    v5 = _cfg_json(built, "llama3_scaled")
    hub = {k: v for k, v in v5.items() if k not in ("rope_parameters", "head_dim")}
    rp = v5["rope_parameters"]
    hub["rope_theta"] = rp["rope_theta"]
    hub["rope_scaling"] = {"type": "llama3", **{k: rp[k] for k in rp if k not in ("rope_type", "rope_theta")}}
    assert hfm.config_from_hf(hub) == hfm.config_from_hf(v5)
    q = _cfg_json(built, "qwen2_untied")
    q.pop("head_dim", None)
    q["rope_theta"] = q.pop("rope_parameters")["rope_theta"]
    cq = hfm.config_from_hf(q)
    assert cq.dim_head == 16 and cq.rope_theta == 1e6 and cq.qkv_bias and not cq.o_bias
    assert (
        hfm.config_from_hf({"model_type": "qwen3", "hidden_size": 64}).dim_head == 128
    )  # Qwen3Config default


@pytest.mark.parametrize(
    "name, change, field, value",
    [
        ("llama_sharded", {"mlp_bias": True}, "mlp_bias", "True"),
        ("qwen2_tied", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1,
                        "layer_types": None}, "use_sliding_window", "True"),
        ("qwen3", {"layer_types": ["full_attention", "sliding_attention"], "use_sliding_window": True,
                   "sliding_window": 64}, "use_sliding_window", "True"),
        ("llama3_scaled", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
         "rope_parameters.rope_type", "'yarn'"),
        ("llama3_scaled", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.rope_type",
         "'linear'"),
        ("llama_sharded", {"model_type": "mixtral"}, "model_type", "'mixtral'"),
        ("qwen3", {"model_type": "qwen3_moe"}, "model_type", "'qwen3_moe'"),
        ("qwen3", {"num_experts": 8}, "num_experts", "8"),
        ("llama_sharded", {"hidden_act": "gelu"}, "hidden_act", "'gelu'"),
        ("qwen2_tied", {"partial_rotary_factor": 0.5}, "partial_rotary_factor", "0.5"),
        ("qwen2_tied", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config", "'gptq'"),
        ("llama_sharded", {"num_key_value_heads": 3}, "num_key_value_heads", "3"),
    ],
)  # fmt: skip
def test_unrepresentable_config_is_one_clear_error(built, name, change, field, value):
    hf = {**_cfg_json(built, name), **change}
    with pytest.raises(hfm.HFConfigError) as e:
        hfm.config_from_hf(hf, file="x/config.json")
    msg = str(e.value)
    print(f"\n[refused] {msg}")
    assert msg.startswith(f"x/config.json: {field}={value}: ") and e.value.field == field
    assert isinstance(e.value, ValueError)


def test_load_hf_refuses_through_the_directory(built, tmp_path):
    src = built("qwen2_tied")[1]
    dst = shutil.copytree(src, tmp_path / "sw")
    hf = {**_cfg_json(built, "qwen2_tied"), "use_sliding_window": True, "sliding_window": 64}
    hf["max_window_layers"] = 0
    hf.pop("layer_types")
    (dst / "config.json").write_text(json.dumps(hf))
    with pytest.raises(hfm.HFConfigError, match=r"config\.json: use_sliding_window=True: sliding-window"):
        hfm.load_hf(str(dst))


def test_missing_and_unexpected_tensors_are_named(built, tmp_path):
    src = built("qwen3")[1]
    tensors = {
        k: np.asarray(v) for k, v in safetensors_io.read(os.path.join(src, "model.safetensors")).items()
    }
    for case, edit, pattern in (
        ("missing", lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"), "k_norm.weight' is missing"),
        ("extra", lambda t: t.update({"model.layers.0.mlp.gate_proj.bias": np.zeros(128, np.float32)}),
         r"unexpected tensors \['model.layers.0.mlp.gate_proj.bias'\]"),
        ("shape", lambda t: t.update({"model.norm.weight": np.ones(65, np.float32)}),
         r"'model.norm.weight' has shape \(65,\), config.json implies \(64,\)"),
    ):  # fmt: skip
        d = tmp_path / case
        d.mkdir()
        shutil.copy(os.path.join(src, "config.json"), d / "config.json")
        t = dict(tensors)
        edit(t)
        safetensors_io.write(str(d / "model.safetensors"), t, {"format": "pt"})
        with pytest.raises(hfm.CheckpointError, match=pattern):
            hfm.load_hf(str(d))
    with pytest.raises(hfm.CheckpointError, match="no model.safetensors"):
        (tmp_path / "empty").mkdir()
        shutil.copy(os.path.join(src, "config.json"), tmp_path / "empty" / "config.json")
        hfm.load_hf(str(tmp_path / "empty"))


def test_tied_checkpoint_with_lm_head_in_the_file(built, tmp_path):
    src = built("qwen2_tied")[1]
    t = {k: np.asarray(v) for k, v in safetensors_io.read(os.path.join(src, "model.safetensors")).items()}
    assert "lm_head.weight" not in t
    t["lm_head.weight"] = t["model.embed_tokens.weight"]
    d = tmp_path / "tied"
    d.mkdir()
    shutil.copy(os.path.join(src, "config.json"), d / "config.json")
    safetensors_io.write(str(d / "model.safetensors"), t, {"format": "pt"})
    cfg, params = hfm.load_hf(str(d))
    assert cfg.tie_embeddings and "lm_head" not in params


# ----------------------------------------------------------------------------------------------------------
# export details: LoRA, tokenizer, atomic write, shardings


def test_save_hf_folds_lora_adapters(built, tmp_path):
    cfg, params = hfm.load_hf(built("qwen3")[1])
    ad = lora.init(params, jax.random.PRNGKey(0), rank=4)
    ad = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape), ad)  # B != 0
    tok, mask = (jnp.asarray(x) for x in _inputs(cfg.vocab_size))
    want = _FWD(lora.fold(params, ad, alpha=8.0), cfg, tok, mask)  # = forward(merge(...)): tests/test_lora.py
    assert float(jnp.abs(want - _FWD(params, cfg, tok, mask)).max()) > 1e-3  # the adapters matter
    for kw in (dict(adapters=ad, lora_alpha=8.0), {}):
        p = params if kw else lora.merge(params, ad, alpha=8.0)  # adapters given, or already merged
        out = hfm.save_hf(str(tmp_path / f"m{len(kw)}"), cfg, p, **kw)
        cfg2, p2 = hfm.load_hf(out)
        assert cfg2 == cfg
        np.testing.assert_allclose(_FWD(p2, cfg2, tok, mask), want, atol=1e-5, rtol=1e-5)
    # PEFT format: applied by hand to the transformers model (W += B A alpha / r), it gives the same logits
    out = hfm.save_peft_adapters(str(tmp_path / "peft"), cfg, ad, lora_alpha=8.0)
    conf = json.load(open(os.path.join(out, "adapter_config.json")))
    assert (conf["peft_type"], conf["r"], conf["lora_alpha"]) == ("LORA", 4, 8.0)
    tensors = safetensors_io.read(os.path.join(out, "adapter_model.safetensors"))
    assert tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"].shape == (4, 64)
    assert tensors["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"].shape == (64, 4)
    model = transformers.AutoModelForCausalLM.from_pretrained(built("qwen3")[1], dtype=torch.float32).eval()
    weights = dict(model.named_parameters())
    with torch.no_grad():
        for name, a in tensors.items():
            if name.endswith(".lora_A.weight"):
                mod = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                b = tensors[name.replace("lora_A", "lora_B")]
                weights[mod + ".weight"] += torch.tensor(np.asarray(b) @ np.asarray(a)) * (8.0 / 4)
    e_logit, e_logp = _rel(_torch_logits(model, np.asarray(tok), np.asarray(mask)), np.asarray(want), mask)
    print(f"\n[peft] qwen3 + LoRA r=4: max|dlogit|/scale={e_logit:.2e} max|dlogp|/scale={e_logp:.2e}")
    assert e_logit <= TOL and e_logp <= TOL


class _Tok:
    bos_id, eos_ids, pad_id = 1, (2, 5), 0

    def __init__(self, fail=False):
        self.fail = fail

    def save(self, path):
        if self.fail:
            raise RuntimeError("tokenizer save failed")
        with open(os.path.join(path, "tokenizer.json"), "w") as fh:
            fh.write("{}")


def test_save_hf_tokenizer_and_atomic_write(built, tmp_path):
    cfg, params = hfm.load_hf(built("qwen2_tied")[1])
    out = hfm.save_hf(str(tmp_path / "m"), cfg, params, _Tok())
    hf = json.load(open(os.path.join(out, "config.json")))
    assert (hf["bos_token_id"], hf["eos_token_id"], hf["pad_token_id"]) == (1, [2, 5], 0)
    assert os.path.exists(os.path.join(out, "tokenizer.json"))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        hfm.save_hf(out, cfg, params)
    with pytest.raises(RuntimeError, match="tokenizer save failed"):
        hfm.save_hf(str(tmp_path / "half"), cfg, params, _Tok(fail=True))
    assert sorted(os.listdir(tmp_path)) == ["m"]  # nothing half-written, no temp dir
    hfm.save_hf(out, cfg, params, overwrite=True)
    assert not os.path.exists(os.path.join(out, "tokenizer.json")) and sorted(os.listdir(tmp_path)) == ["m"]
    with pytest.raises(ValueError, match="value_head=True"):
        hfm.save_hf(str(tmp_path / "v"), dataclasses.replace(cfg, value_head=True), params)


def test_load_hf_into_shardings(built):
    from jax.sharding import NamedSharding, PartitionSpec

    path = built("llama_sharded")[1]
    cfg, params = hfm.load_hf(path)
    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
    shard = jax.tree.map(
        lambda x: NamedSharding(mesh, PartitionSpec(*([None] * (x.ndim - 1)), "model")), params
    )
    _, placed = hfm.load_hf(path, shardings=shard)
    for a, s, b in zip(jax.tree.leaves(placed), jax.tree.leaves(shard), jax.tree.leaves(params), strict=True):
        assert a.sharding == s
        np.testing.assert_array_equal(a, b)


def test_safetensors_io_roundtrip_bf16(tmp_path):
    st = pytest.importorskip("safetensors.torch")

    x = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": jnp.arange(5, dtype=jnp.bfloat16) / 3}
    safetensors_io.write(str(tmp_path / "x.safetensors"), x, {"format": "pt"})
    back = safetensors_io.read(str(tmp_path / "x.safetensors"))
    np.testing.assert_array_equal(back["a"], x["a"])
    assert back["b"].dtype == jnp.bfloat16 and np.array_equal(back["b"], np.asarray(x["b"]))
    ref = st.load_file(str(tmp_path / "x.safetensors"))  # the reference reader agrees
    assert ref["b"].dtype == torch.bfloat16
    np.testing.assert_array_equal(ref["b"].float().numpy(), np.asarray(x["b"], np.float32))
