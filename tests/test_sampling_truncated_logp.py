"""Behaviour log-probs under top-k / top-p (issue 23, item 9): the sampler's `logp` is the log-probability of
the sampled token under the distribution it was drawn from, log_softmax(filter(logits / T)) (renormalised over
the kept set), so the importance-sampling correction (--tis_cap) sees the truncation. With the filters off it
is the untruncated log_softmax(logits / T), bit for bit as before; greedy keeps log_softmax(logits), T = 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import pool
from grpo_jax.policies import lora, sampling
from grpo_jax.policies import transformer as tfm

# ------------------------------------------------------------------------------------- literal values, V = 5

LOGITS = jnp.array([2.0, 1.0, 0.5, 0.0, -1.0], jnp.float32)
# softmax(LOGITS)       = [0.5630, 0.2071, 0.1256, 0.0762, 0.0280]  cumsum [0.563, 0.770, 0.896, 0.972, 1]
# softmax(LOGITS / 0.5) = [0.8292, 0.1122, 0.0413, 0.0152, 0.0021]  cumsum [0.829, 0.941, 0.983, 0.998, 1]
# Kept set S, then logp(i) = x_i / T − log Σ_{j∈S} exp(x_j / T)  (hand-computed, 15 digits):
#   T = 1,   top_k = 2:      S = {0, 1}:    −log(1 + e^−1)             = −0.313261687518223, then −1 − that
#   T = 0.5, top_k = 2:      S = {0, 1}:    −log(1 + e^−2)             = −0.126928011042972, −2.12692…
#   T = 1,   top_p = 0.8:    S = {0, 1, 2}: −log(1 + e^−1 + e^−1.5)    = −0.464368784107945, −1.464…, −1.964…
#   T = 0.5, top_p = 0.95:   S = {0, 1, 2}: −log(1 + e^−2 + e^−3)      = −0.169846019556286, −2.169…, −3.169…
#   T = 0.5, top_p = 0.8:    S = {0}:       0 (the nucleus is taken under the tempered softmax)
#   T = 1,   top_k = 4, top_p = 0.8: S = {0, 1, 2} (the tighter of the two)
LITERAL_CASES = [
    (1.0, 2, 1.0, {0: -0.313261687518223, 1: -1.313261687518223}),
    (0.5, 2, 1.0, {0: -0.126928011042972, 1: -2.126928011042972}),
    (1.0, 0, 0.8, {0: -0.464368784107945, 1: -1.464368784107945, 2: -1.964368784107945}),
    (0.5, 0, 0.95, {0: -0.169846019556286, 1: -2.169846019556286, 2: -3.169846019556286}),
    (0.5, 0, 0.8, {0: 0.0}),
    (1.0, 4, 0.8, {0: -0.464368784107945, 1: -1.464368784107945, 2: -1.964368784107945}),
]
UNTRUNCATED_T1 = [
    -0.574437939627796,
    -1.574437939627796,
    -2.074437939627796,
    -2.574437939627796,
    -3.574437939627796,
]
N_DRAWS = 4000

choose_jit = jax.jit(sampling.choose_tokens)


@pytest.mark.parametrize("temperature,top_k,top_p,want", LITERAL_CASES)
def test_literal_truncated_logp(temperature, top_k, top_p, want):
    rows = jnp.broadcast_to(LOGITS, (N_DRAWS, 5))  # N_DRAWS independent draws from one row
    sp = sampling.sampling_params(temperature, top_k, top_p)
    tok, lp = choose_jit(rows, jax.random.PRNGKey(0), sp)
    tok, lp = np.asarray(tok), np.asarray(lp)
    assert set(tok.tolist()) == set(want)  # only kept tokens are drawn, and every kept one is
    np.testing.assert_allclose(lp, [want[t] for t in tok], atol=1e-6, rtol=0)
    # the returned log-probs are those of the distribution actually sampled: the draw frequencies match them
    for t, logp in want.items():
        assert abs(np.mean(tok == t) - np.exp(logp)) < 0.04, (t, np.mean(tok == t), np.exp(logp))


def test_literal_filters_off_and_greedy_keep_the_untruncated_convention():
    rows = jnp.broadcast_to(LOGITS, (N_DRAWS, 5))
    tok, lp = choose_jit(rows, jax.random.PRNGKey(1), sampling.sampling_params(1.0, 0, 1.0))
    assert set(np.asarray(tok).tolist()) == {0, 1, 2, 3, 4}
    np.testing.assert_allclose(lp, np.asarray(UNTRUNCATED_T1)[np.asarray(tok)], atol=1e-6, rtol=0)
    for top_k, top_p in [(0, 1.0), (2, 1.0), (0, 0.5)]:  # greedy: argmax, logp untruncated at T = 1
        tok, lp = choose_jit(rows[:3], jax.random.PRNGKey(2), sampling.sampling_params(0.0, top_k, top_p))
        np.testing.assert_array_equal(tok, [0, 0, 0])
        np.testing.assert_allclose(lp, [UNTRUNCATED_T1[0]] * 3, atol=1e-6, rtol=0)


def test_literal_member_vmap_as_in_sample_members():
    """sample_members / sample_lora_members vmap choose_tokens with a per-member temperature (top_k shared):
    each member's logp is that of its own truncated, tempered distribution; a greedy member keeps T = 1."""
    choose = jax.jit(jax.vmap(sampling.choose_tokens, in_axes=(0, 0, sampling.SamplingParams(0, None, None))))
    rows = jnp.broadcast_to(LOGITS, (3, N_DRAWS, 5))
    temps = jnp.array([1.0, 0.5, 0.0], jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    tok, lp = choose(rows, keys, sampling.SamplingParams(temps, jnp.int32(2), jnp.float32(1.0)))
    tok, lp = np.asarray(tok), np.asarray(lp)
    for m, want in enumerate([LITERAL_CASES[0][3], LITERAL_CASES[1][3], {0: UNTRUNCATED_T1[0]}]):
        assert set(tok[m].tolist()) == set(want)
        np.testing.assert_allclose(lp[m], [want[t] for t in tok[m]], atol=1e-6, rtol=0)


def _old_choose_tokens(logits, key, sp):
    """choose_tokens before the fix (logp always untruncated): the bit-for-bit reference with filters off (the
    token chosen as in the code under test: argmax or sampling.sample_categorical in a lax.cond)."""
    greedy = sp.temperature <= 0
    lg = logits.astype(jnp.float32) / jnp.where(greedy, 1.0, sp.temperature)
    lsm = jax.nn.log_softmax(lg, axis=-1)
    need_filter = (sp.top_k > 0) | (sp.top_p < 1.0)
    filt = jax.lax.cond(need_filter, lambda x: sampling.filter_logits(x, sp.top_k, sp.top_p), lambda x: x, lg)
    argmax = lambda: jnp.argmax(lg, axis=-1).astype(jnp.int32)
    tok = jax.lax.cond(greedy, argmax, lambda: sampling.sample_categorical(key, filt))
    return tok, jnp.take_along_axis(lsm, tok[..., None], axis=-1)[..., 0]


def test_filters_off_bitwise_identical_to_the_old_choice():
    x = jax.random.normal(jax.random.PRNGKey(4), (6, 3, 777)) * 3.0
    old = jax.jit(_old_choose_tokens)
    for t in (1.0, 0.7, 1.3, 0.0):
        sp = sampling.sampling_params(t)
        for s in range(3):
            a, b = choose_jit(x, jax.random.PRNGKey(s), sp), old(x, jax.random.PRNGKey(s), sp)
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])  # bit for bit, not allclose


# ------------------------------------------------------------------ through the real sampler (KV cache)

CFG = tfm.TransformerConfig(
    vocab_size=32,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,
    qkv_bias=True,
    tie_embeddings=False,
)
B, G, P, T = 2, 4, 5, 6


def _prompts():
    tok = jax.random.randint(jax.random.PRNGKey(11), (B, P), 2, CFG.vocab_size)
    mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], jnp.int32)  # left padding in row 0
    return jnp.where(mask > 0, tok, 0), mask


def _filter_np(x, top_k, top_p):
    """Independent numpy top-k / top-p (one full sort, float64 softmax) of float32 rows x [N, V]."""
    srt = -np.sort(-x, axis=-1)
    v = x.shape[-1]
    thr = np.full(x.shape[:-1] + (1,), -np.inf)
    if top_k > 0:
        thr = np.maximum(thr, srt[:, min(top_k, v) - 1 : min(top_k, v)])
    if top_p < 1.0:
        p = np.exp(srt.astype(np.float64) - srt[:, :1])
        p /= p.sum(-1, keepdims=True)
        before = np.cumsum(p, -1) - p
        n = np.maximum((before < top_p).sum(-1, keepdims=True), 1)
        thr = np.maximum(thr, np.take_along_axis(srt, n - 1, -1))
    return np.where(x >= thr, x, -np.inf)


def _log_softmax_np(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _recompute(params, prompt, pmask, out, temperature, top_k, top_p):
    """(truncated, untruncated) log-probs of out's tokens [B, G, T] from ONE full forward pass over prompt +
    completion (tfm.forward, no KV cache): position P − 1 + t predicts completion token t."""
    b, g, t = out.tokens.shape
    seq = jnp.concatenate([jnp.broadcast_to(prompt[:, None], (b, g, P)), out.tokens], -1).reshape(
        b * g, P + t
    )
    msk = jnp.concatenate([jnp.broadcast_to(pmask[:, None], (b, g, P)), jnp.ones_like(out.tokens)], -1)
    logits, _ = tfm.forward(params, CFG, seq, msk.reshape(b * g, P + t))
    lg = np.asarray(logits[:, P - 1 : P - 1 + t], np.float32) / np.float32(temperature)  # [BG, T, V]
    lg = lg.reshape(-1, lg.shape[-1])
    toks = np.asarray(out.tokens).reshape(-1, 1)
    filt = _filter_np(lg, top_k, top_p)
    trunc = np.take_along_axis(_log_softmax_np(filt), toks, -1).reshape(b, g, t)
    full = np.take_along_axis(_log_softmax_np(lg), toks, -1).reshape(b, g, t)
    kept = np.isfinite(np.take_along_axis(filt, toks, -1)).reshape(b, g, t)
    return trunc, full, kept


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(0.7, 3, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.7), (1.3, 4, 0.8), (0.7, 0, 1.0)]
)
def test_make_sampler_logp_is_the_truncated_behaviour_logp(temperature, top_k, top_p):
    params = tfm.init_params(CFG, jax.random.PRNGKey(0))
    prompt, pmask = _prompts()
    sampler = sampling.make_sampler(CFG, group=G, max_new=T, eos_id=1, pad_id=0)
    out = sampler(
        params, prompt, pmask, jax.random.PRNGKey(3), sampling.sampling_params(temperature, top_k, top_p)
    )
    m = np.asarray(out.mask) > 0
    trunc, full, kept = _recompute(params, prompt, pmask, out, temperature, top_k, top_p)
    assert m.sum() >= 8
    assert kept[m].all()  # every sampled token is inside the truncation
    np.testing.assert_allclose(np.asarray(out.logp)[m], trunc[m], atol=2e-5, rtol=0)
    if top_k == 0 and top_p >= 1.0:  # filters off: today's property, logp = the trainer's untruncated logp
        logits, _ = tfm.forward_grouped(params, CFG, prompt, pmask, out.tokens)
        want, _ = tfm.token_logp(logits, out.tokens, temperature)
        np.testing.assert_allclose(np.asarray(out.logp)[m], np.asarray(want)[m], atol=2e-5, rtol=0)
    else:  # the truncation is visible: logp exceeds the untruncated π by −log(kept mass) > 0
        assert (np.asarray(out.logp)[m] - full[m]).min() > 1e-3


def _lora_members(base, n):
    out = []
    for i in range(n):
        ad = lora.init(base, jax.random.PRNGKey(20 + i), rank=2)
        out.append(
            jax.tree.map(lambda x, i=i: x + 0.3 * jax.random.normal(jax.random.PRNGKey(40 + i), x.shape), ad)
        )
    return out


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_pool_member_samplers_return_truncated_logp(kind):
    """pool.make_member_sampler (sample_members / sample_lora_members, a per-member temperature, top_k and
    top_p shared): each member's logp is its own truncated behaviour logp, recomputed by a full forward."""
    base = tfm.init_params(CFG, jax.random.PRNGKey(0))
    if kind == "full":
        members = [tfm.init_params(CFG, jax.random.PRNGKey(30 + i)) for i in range(2)]
        merged = members
        msample = pool.make_member_sampler(CFG, group=G, max_new=T, eos_id=1, pad_id=0)
    else:
        members = _lora_members(base, 2)
        merged = [lora.merge(base, a, alpha=4.0) for a in members]
        msample = pool.make_member_sampler(CFG, group=G, max_new=T, eos_id=1, pad_id=0, lora_alpha=4.0)
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *members)
    prompt, pmask = _prompts()
    temps, top_k, top_p = [0.7, 1.3], 3, 0.9
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    out = msample(
        stacked,
        jnp.array([0, 1]),
        base,
        prompt,
        pmask,
        keys,
        jnp.array(temps),
        jnp.int32(top_k),
        jnp.float32(top_p),
    )
    for j in range(2):
        oj = jax.tree.map(lambda x, j=j: x[j], out)
        m = np.asarray(oj.mask) > 0
        trunc, full, kept = _recompute(merged[j], prompt, pmask, oj, temps[j], top_k, top_p)
        assert kept[m].all()
        np.testing.assert_allclose(np.asarray(oj.logp)[m], trunc[m], atol=2e-5, rtol=0)
        assert (np.asarray(oj.logp)[m] - full[m]).min() > 1e-3


@pytest.mark.slow
def test_samplers_filters_off_bitwise_identical_to_the_old_choice(monkeypatch):
    """With top_k = 0 and top_p = 1 every sampler entry point returns what it returned before the fix: the
    same samplers traced with the pre-fix choose_tokens give the same tokens, masks and lengths bit for bit,
    and the same logp (bit for bit but for the vmapped members' one-ulp fusion differences)."""
    params = tfm.init_params(CFG, jax.random.PRNGKey(0))
    prompt, pmask = _prompts()
    members = jax.tree.map(
        lambda *x: jnp.stack(x), *[tfm.init_params(CFG, jax.random.PRNGKey(30 + i)) for i in range(2)]
    )
    adapters = jax.tree.map(lambda *x: jnp.stack(x), *_lora_members(params, 2))
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    kw = dict(group=G, max_new=T, eos_id=1, pad_id=0)
    off = (jnp.int32(0), jnp.float32(1.0))

    def run_all():  # fresh jits, so each traces the module's current choose_tokens
        one = jax.jit(lambda p, sp: sampling.sample(p, CFG, prompt, pmask, keys[0], sp, **kw))
        outs = [one(params, sampling.SamplingParams(jnp.float32(t), *off)) for t in (1.0, 0.7, 0.0)]
        sp = sampling.SamplingParams(jnp.array([1.3, 0.0], jnp.float32), *off)
        outs.append(
            jax.jit(lambda m, sp: sampling.sample_members(m, CFG, prompt, pmask, keys, sp, **kw))(members, sp)
        )
        fn = jax.jit(
            lambda a, sp: sampling.sample_lora_members(params, a, 4.0, CFG, prompt, pmask, keys, sp, **kw)
        )
        outs.append(fn(adapters, sp))
        return outs

    new = run_all()
    monkeypatch.setattr(sampling, "choose_tokens", _old_choose_tokens)
    old = run_all()
    for a, b in zip(new, old, strict=True):
        for name, x, y in zip(a._fields, a, b, strict=True):
            if name == "logp":  # vmapped with per-member temperatures both lax.cond branches run as a select,
                # and XLA fuses the log-softmax differently around it: one ulp here and there
                np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6, rtol=0)
            else:
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
