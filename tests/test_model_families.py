"""The model families beyond Llama / Qwen (grpo_jax.policies.families): Gemma 3 text, Gemma 2, SmolLM3 and
Mistral, against transformers, through every path that runs the model.

Each checkpoint is built once with transformers from a small random config (no hub; every weight perturbed,
initializer_range 0.3 so that the soft-caps and the windows change the logits by O(1)), saved, loaded with
load_hf. The sliding window (8) is shorter than the sequences (40 tokens, row 1 left-padded by 9), so a
query attends to part of its context only, in the forward, in the sampler's KV cache and in both rollout
engines. Checked: logits = transformers' (the test_hf_checkpoints tolerance), the parity test fails without
each option; the training forward (forward_grouped, the chunked soft-capped head) = the plain forward; the
KV-cache path = the forward, float32 and bf16; greedy tokens of both engines, first and later turns, = the
forward's argmax path; export round-trips; the config layouts real checkpoints ship read the same.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grpo_jax.policies import families, packed, sampling  # noqa: E402
from grpo_jax.policies import logp as lp  # noqa: E402
from grpo_jax.policies import transformer as tfm  # noqa: E402
from grpo_jax.pretrained import hf as hfm  # noqa: E402
from grpo_jax.pretrained import save_pretrained  # noqa: E402
from grpo_jax.rollout.engines import ENGINES, make_engine  # noqa: E402

S, PAD, WINDOW = 40, 9, 8  # sequence length, left padding of row 1, sliding window (< S)
TOL = 2e-4  # as tests/test_hf_checkpoints.py
SMALL = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    initializer_range=0.3,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
GEMMA = dict(SMALL, sliding_window=WINDOW, query_pre_attn_scalar=20, final_logit_softcapping=2.0)

# name -> (transformers config class, model class, config kwargs, options whose removal must break parity)
CASES = {
    # the layout released Gemma 3 checkpoints ship: sliding_window_pattern + rope_local_base_freq (2: layer 0
    # slides with RoPE base 100, layer 1 is global with base 1e4); transformers saves it as layer_types
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(GEMMA, sliding_window_pattern=2, rope_theta=1e4, rope_local_base_freq=100.0),
                    [dict(sliding_window=None, layer_types=None, rope_local_theta=None),
                     dict(rope_local_theta=1e4), dict(final_softcap=None), dict(norm_offset=0.0),
                     dict(embed_scale=False)]),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(GEMMA, attn_logit_softcapping=3.0),
               [dict(sliding_window=None, layer_types=None), dict(attn_softcap=None),
                dict(final_softcap=None), dict(query_pre_attn_scalar=None), dict(post_norms=False)]),
    # no_rope_layers [1, 0]: layer 1 has no RoPE and, with use_sliding_window, is the sliding layer
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                dict(SMALL, no_rope_layers=[1, 0], use_sliding_window=True, sliding_window=WINDOW),
                [dict(sliding_window=None, layer_types=None), dict(no_rope_layers=None)]),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(SMALL, sliding_window=WINDOW),
                [dict(sliding_window=None, layer_types=None)]),
}  # fmt: skip
NAMES = list(CASES)
EOS = (299,)  # an end-of-generation id greedy decoding of these models does not reach early


def _inputs():
    rng = np.random.default_rng(0)
    tok = rng.integers(3, 300, (2, S))
    mask = np.ones((2, S), np.int64)
    mask[1, :PAD] = 0
    tok[1, :PAD] = 0
    return tok, mask


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (checkpoint dir, transformers' float32 logits [2, S, V], cfg, params); each built once."""
    root = tmp_path_factory.mktemp("families")
    transformers.logging.set_verbosity_error()
    cache: dict = {}

    def get(name):
        if name not in cache:
            cfg_cls, model_cls, kw, _ = CASES[name]
            torch.manual_seed(sum(map(ord, name)))
            # float32 whatever torch's default dtype (tests/test_trl_objectives.py sets float64 at import,
            # which every module collected after it in the same worker inherits)
            model = (
                getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw))
                .to(torch.float32)
                .eval()
            )
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            path = str(root / name)
            model.save_pretrained(path)
            tok, mask = _inputs()
            cfg, params = hfm.load_hf(path)
            cache[name] = (path, _torch_logits(model, tok, mask), cfg, params)
        return cache[name]

    return get


from test_hf_checkpoints import _FWD, _rel, _torch_logits, cached_decode_vs_forward  # noqa: E402  (one copy of the parity helpers)


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers_and_need_every_option(built, name):
    path, ref, cfg, params = built(name)
    assert cfg.family == name and cfg.layer_types is not None and cfg.sliding_window == WINDOW
    tok, mask = _inputs()
    e_logit, e_logp = _rel(np.asarray(_FWD(params, cfg, jnp.asarray(tok), jnp.asarray(mask))), ref, mask)
    print(f"\n[parity] {name}: max|dlogit|/scale={e_logit:.2e} max|dlogp|/scale={e_logp:.2e}")
    assert e_logit <= TOL and e_logp <= TOL
    for broken in CASES[name][3]:  # the test can fail: without any one option it misses by far
        bad = dataclasses.replace(cfg, family=None, **broken)
        e, _ = _rel(np.asarray(_FWD(params, bad, jnp.asarray(tok), jnp.asarray(mask))), ref, mask)
        print(f"[broken] {name} with {broken}: {e:.2e}")
        assert e > 100 * TOL


@pytest.mark.parametrize("name", NAMES)
def test_training_forward_matches_forward(built, name):
    """forward_grouped (the train step: prompt encoded once, completions attending to it) = forward on the
    concatenated rows; the train step's policy function, full, with the chunked (soft-capped) head and
    packed (--pack_tokens: two completions of a group in one row, each reading its group's prompt)."""
    _, _, cfg, params = built(name)
    tok, mask = _inputs()
    p, t, g = 14, S - 14, 2
    prompt, pmask = jnp.asarray(tok[:, :p]), jnp.asarray(mask[:, :p])
    comp = jnp.stack([jnp.asarray(tok[:, p:]), jnp.asarray(tok[::-1, p:])], 1)  # [B, G, T]
    got, _ = tfm.forward_grouped(params, cfg, prompt, pmask, comp)
    rows = jnp.concatenate([jnp.repeat(prompt, g, 0), comp.reshape(-1, t)], 1)
    rmask = jnp.concatenate([jnp.repeat(pmask, g, 0), jnp.ones((2 * g, t), pmask.dtype)], 1)
    want = _FWD(params, cfg, rows, rmask)[:, p - 1 : -1].reshape(got.shape)
    np.testing.assert_allclose(got, want, atol=2e-5 * float(jnp.abs(want).max()), rtol=0)
    full = lp.policy_logp_fn(cfg)(params, prompt, pmask, comp, 0.7)
    chunked = jax.jit(lp.policy_logp_fn(dataclasses.replace(cfg, logp_chunk=16)))(
        params, prompt, pmask, comp, 0.7
    )
    ref = tfm.token_logp(want, comp, 0.7)
    for a, b, c in zip(full, chunked, ref, strict=True):
        np.testing.assert_allclose(a, c, atol=1e-4)
        np.testing.assert_allclose(b, c, atol=1e-4)
    cmask = (np.arange(t) < np.asarray([[26, 10], [15, 20]])[..., None]).astype(np.float32)
    layout, _ = packed.plan(np.asarray(pmask), np.asarray(comp), cmask, 40)
    assert layout.tokens.shape[1] == 2  # one row per group
    one = jax.tree.map(lambda x: jnp.asarray(x[0]), layout)
    got = packed.packed_policy_fn(cfg)(params, prompt, pmask, one, 0.7)
    for a, c in zip(got, ref, strict=True):
        np.testing.assert_allclose(np.asarray(a) * cmask, np.asarray(c) * cmask, atol=1e-4)
    if cfg.final_softcap is not None:  # the chunked soft-capped head's gradient = the full head's

        def loss(params, c):
            lps, ent = lp.policy_logp_fn(c)(params, prompt, pmask, comp, 0.7)
            return jnp.sum(lps) + 0.1 * jnp.sum(ent)

        g_full = jax.grad(loss)(params, cfg)
        g_chunk = jax.grad(loss)(params, dataclasses.replace(cfg, logp_chunk=16))
        for a, b in zip(jax.tree.leaves(g_chunk), jax.tree.leaves(g_full), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-4 * float(jnp.abs(b).max()) + 1e-7)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cached_decode_matches_forward(built, name, dtype):
    """The sampler's KV-cache path (prefill + decode_step; bf16: the multiply-and-reduce attention over the
    [.., Dh, T] key cache) = forward, step by step, on the left-padded batch: 12 tokens decoded after a
    28-token prompt, each attending, in the sliding layers, to the last 8 positions only."""
    _, _, cfg, params = built(name)
    cfg = dataclasses.replace(cfg, compute_dtype=dtype)
    tok, mask = (jnp.asarray(x) for x in _inputs())
    t = 12
    got, ref = cached_decode_vs_forward(params, cfg, tok, mask, t)
    # bf16: the forward rounds every key and value to bf16, the decode keeps its own in float32 (KVCache)
    tol = 2e-5 if dtype == "float32" else 6e-2
    np.testing.assert_allclose(got, ref, atol=tol * float(jnp.abs(ref).max()), rtol=0)


def _argmax_path_ok(params, cfg, contexts: list[np.ndarray], replies: list[np.ndarray]) -> None:
    """Each reply is the greedy continuation of its context under forward: token j = argmax of the logits
    after context + reply[:j] (one left-padded forward over all rows)."""
    width = max(c.size + r.size for c, r in zip(contexts, replies, strict=True))
    rows = np.zeros((len(contexts), width), np.int32)
    mask = np.zeros_like(rows)
    for i, (c, r) in enumerate(zip(contexts, replies, strict=True)):
        seq = np.r_[c, r]
        rows[i, width - seq.size :], mask[i, width - seq.size :] = seq, 1
    pred = np.asarray(jnp.argmax(_FWD(params, cfg, jnp.asarray(rows), jnp.asarray(mask)), -1))
    for i, r in enumerate(replies):
        n = r.size
        assert n > 0
        np.testing.assert_array_equal(pred[i, width - n - 1 : width - 1], r, err_msg=f"row {i}")


@pytest.mark.parametrize("name", NAMES)
def test_engines_greedy_tokens_follow_the_forward(built, name):
    """Both rollout engines (static: the batch sampler and its KV-cache continuation; continuous: 2 slots for
    4 samples, so samples are inserted into used slots and ring columns are reused) decode the forward's
    argmax path, first turn and a later turn (feedback appended, then a reply); sampled tokens carry the
    trainer's log-probs. Prompt 14 tokens + 12 new (+ 3 feedback + 12): longer than the window."""
    _, _, cfg, params = built(name)
    tok, mask = _inputs()
    prompt, pmask = tok[:, 12:26].astype(np.int32), mask[:, 12:26].astype(np.int32)  # row 1: 2 pads
    real = [prompt[b][pmask[b] > 0] for b in range(2)]
    fb = np.asarray([[7, 8, 9], [10, 11, 0]], np.int32)
    greedy, sp = sampling.sampling_params(0.0), sampling.sampling_params(1.0)
    for kind in ENGINES:
        kw = dict(slots=2, chunk=5) if kind == "continuous" else {}
        eng = make_engine(kind, cfg, max_new=12, eos_ids=EOS, pad_id=0, **kw)
        out, conv = eng.generate_kept(params, prompt, pmask, jax.random.key(0), n=2, sp=greedy)
        lengths, tokens = np.asarray(out.lengths), np.asarray(out.tokens)
        replies = [tokens[b, j, : lengths[b, j]] for b in range(2) for j in range(2)]
        _argmax_path_ok(params, cfg, [real[b] for b in range(2) for _ in range(2)], replies)
        out2, _ = eng.extend(
            params, eng.select(conv, [0, 2]), fb, (fb > 0).astype(np.int32), jax.random.key(4), sp=greedy
        )
        ctx2 = [np.r_[real[b], replies[2 * b], fb[b][fb[b] > 0]] for b in range(2)]
        l2 = np.asarray(out2.lengths)
        _argmax_path_ok(params, cfg, ctx2, [np.asarray(out2.tokens)[i, 0, : l2[i, 0]] for i in range(2)])
        drawn = eng.generate(params, prompt, pmask, jax.random.key(3), n=2, sp=sp)
        logits, _ = tfm.forward_grouped(params, cfg, jnp.asarray(prompt), jnp.asarray(pmask), drawn.tokens)
        want = np.asarray(tfm.token_logp(logits, drawn.tokens)[0])
        m = np.asarray(drawn.mask)
        np.testing.assert_allclose(np.asarray(drawn.logp) * m, want * m, atol=2e-5, err_msg=kind)


@pytest.mark.parametrize("name", NAMES)
def test_export_roundtrip(built, name, tmp_path):
    path, ref, cfg, params = built(name)
    out = save_pretrained(str(tmp_path / "export"), cfg, params)
    back, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(back).__name__ == families.get(name).architecture
    tok, mask = _inputs()
    e_logit, e_logp = _rel(_torch_logits(back.eval(), tok, mask), ref, mask)
    print(f"\n[export] {name}: max|dlogit|/scale={e_logit:.2e} max|dlogp|/scale={e_logp:.2e}")
    assert e_logit <= TOL and e_logp <= TOL
    cfg2, params2 = hfm.load_hf(out)
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    assert hfm.infer_family(dataclasses.replace(cfg, family=None)) == name  # the fields say which family


def test_config_layouts_read_the_same(built):
    """Gemma 3: the released checkpoints' layout (sliding_window_pattern, rope_theta, rope_local_base_freq, no
    layer_types / rope_parameters) and transformers 5.x's give one config; SmolLM3 without no_rope_layers
    gets every 4th layer without RoPE; Mistral with sliding_window null has no window; Gemma 2 without
    layer_types alternates, sliding first."""
    with open(os.path.join(built("gemma3_text")[0], "config.json")) as fh:
        v5 = json.load(fh)
    assert v5["layer_types"] == ["sliding_attention", "full_attention"] and "rope_parameters" in v5
    hub = {k: v for k, v in v5.items() if k not in ("layer_types", "rope_parameters")}
    hub.update(sliding_window_pattern=2, rope_theta=1e4, rope_local_base_freq=100.0, rope_scaling=None)
    cfg = hfm.config_from_hf(v5)
    assert hfm.config_from_hf(hub) == cfg and cfg.rope_local_theta == 100.0 and cfg.rope_theta == 1e4
    assert transformers.Gemma3TextConfig(**hub).layer_types == v5["layer_types"]  # transformers agrees
    six = hfm.config_from_hf({**hub, "num_hidden_layers": 12, "sliding_window_pattern": 6})
    assert [i for i, t in enumerate(six.layer_types) if t == "full_attention"] == [5, 11]
    base = dict(SMALL, num_hidden_layers=8)
    sm = hfm.config_from_hf({**base, "model_type": "smollm3"})
    assert sm.no_rope_layers == (1, 1, 1, 0, 1, 1, 1, 0) and sm.layer_types is None
    assert sm.rope_theta == 2e6 and sm.tie_embeddings  # SmolLM3Config defaults
    assert hfm.config_from_hf({**base, "model_type": "mistral", "sliding_window": None}).layer_types is None
    g2 = hfm.config_from_hf({**base, "model_type": "gemma2"})
    assert g2.layer_types == ("sliding_attention", "full_attention") * 4 and g2.sliding_window == 4096
    assert (g2.attn_softcap, g2.final_softcap, g2.query_pre_attn_scalar) == (50.0, 30.0, 256.0)


@pytest.mark.parametrize(
    "change, field, value",
    [
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "use_bidirectional_attention",
         "True"),
        ({"model_type": "gemma3_text", "hidden_activation": "gelu"}, "hidden_activation", "'gelu'"),
        ({"model_type": "gemma3_text", "rope_parameters": {"rope_type": "default"}}, "rope_parameters", None),
        ({"model_type": "gemma2", "sliding_window": None}, "sliding_window", "None"),
        ({"model_type": "smollm3", "mlp_bias": True}, "mlp_bias", "True"),
        ({"model_type": "smollm3", "layer_types": ["full_attention", "sliding_attention"]},
         "use_sliding_window", None),
        ({"model_type": "mistral", "hidden_act": "gelu"}, "hidden_act", "'gelu'"),
    ],
)  # fmt: skip
def test_unrepresentable_family_configs_are_one_clear_error(change, field, value):
    with pytest.raises(hfm.HFConfigError) as e:
        hfm.config_from_hf({**SMALL, **change}, file="x/config.json")
    print(f"\n[refused] {e.value}")
    assert e.value.field == field and str(e.value).startswith(f"x/config.json: {field}=")
    assert value is None or str(e.value).startswith(f"x/config.json: {field}={value}: ")


def test_gemma_embedding_scale_is_rounded_as_transformers_does():
    """bf16 embeddings x sqrt(48): the scale rounded to bf16 (6.9375, not 6.9282), the product in bf16, as
    Gemma3TextScaledWordEmbedding computes it."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    emb = Gemma3TextScaledWordEmbedding(50, 48, 0, embed_scale=48**0.5).to(torch.bfloat16)
    ids = np.arange(50)[None]
    with torch.no_grad():
        emb.weight.copy_(torch.randn(50, 48).to(torch.bfloat16))
        want = emb(torch.tensor(ids)).float().numpy()
    cfg = tfm.TransformerConfig(vocab_size=50, d_model=48, n_layers=1, n_heads=4, n_kv_heads=4, d_ff=8)
    table = jnp.asarray(emb.weight.detach().float().numpy()).astype(jnp.bfloat16)
    got = tfm.embed_tokens(
        dataclasses.replace(cfg, embed_scale=True), {"embed": table}, jnp.asarray(ids), "float32"
    )
    np.testing.assert_array_equal(np.asarray(got), want)
    exact = np.asarray(table.astype(jnp.float32)) * 48**0.5
    assert np.abs(exact - want).max() > 0  # the rounding of the scale matters


def test_registry_and_config_fields():
    assert tfm.FAMILIES == hfm.FAMILIES == families.FAMILIES
    assert families.FAMILIES[:3] == ("llama", "qwen2", "qwen3")
    from grpo_jax.tokenization.hf import _EOG_TOKENS

    for fam in families.all_families():
        assert fam is families.get(fam.model_type) and fam.architecture.endswith("ForCausalLM")
        assert set(fam.eog_tokens) <= set(_EOG_TOKENS), fam  # the sampler stops at its end-of-turn token
    assert families.find("mixtral") is None and {
        a: f.model_type for a, f in families.gguf_families().items()
    } == {
        "llama": "llama",
        "qwen2": "qwen2",
    }
    base = dict(vocab_size=8, d_model=8, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=8)
    # lists (JSON) become tuples; per-layer fields that change nothing become None: one config per model
    c = tfm.TransformerConfig(**base, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    assert c.layer_types == ("sliding_attention", "full_attention") and hash(c)
    assert tfm.TransformerConfig(**dataclasses.asdict(c)) == c
    assert tfm.TransformerConfig(**base, layer_types=["full_attention"] * 2, no_rope_layers=[1, 1]) == (
        tfm.TransformerConfig(**base)
    )
    assert c.attention_variants == ((4, tfm.ROPE_MAIN), (None, tfm.ROPE_MAIN)) and c.layer_variant == (0, 1)
    for bad, match in (
        (dict(sliding_window=4), "sliding_window=4: must be None unless"),
        (dict(layer_types=("sliding_attention",) * 2), "sliding_window=None: must be a positive integer"),
        (dict(layer_types=("local",) * 2), "layer_types"),
        (dict(no_rope_layers=(1, 2)), "no_rope_layers"),
        (dict(mlp_act="relu"), "mlp_act='relu': valid: silu, gelu_tanh"),
        (dict(rope_local_theta=100.0), "rope_local_theta=100.0"),
        (dict(family="gemma2"), "gemma2 needs norm_offset=1.0"),
        (dict(family="mistral", qkv_bias=True, o_bias=True), "mistral has no attention biases"),
        (dict(family="llama", final_softcap=30.0), "llama has no final_softcap"),
    ):
        with pytest.raises(ValueError, match=match):
            tfm.TransformerConfig(**base, **bad)
