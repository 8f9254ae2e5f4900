"""filter_logits (top-k / top-p without a full sort) keeps exactly the set of the sorted reference."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.policies import sampling


def sorted_reference(logits, top_k, top_p):
    """The previous implementation (one full sort per row), kept as the oracle, with one fix: top_p >= 1 is
    off (as documented). The previous code applied it, and on peaked rows the float32 cumsum of the sorted
    probabilities rounds up to 1.0 before the end of the vocabulary, so top_p = 1 (with a top_k) dropped the
    tail ids (measured: 3806 of 48 000 ids in _logits(0))."""
    srt = jnp.sort(logits, axis=-1)[..., ::-1]  # descending
    v = logits.shape[-1]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
    kth = jnp.take(srt, k - 1, axis=-1)[..., None]
    probs = jax.nn.softmax(srt, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly before each sorted position
    n_keep = jnp.maximum(jnp.sum(before < top_p, axis=-1, keepdims=True), 1)
    pth = jnp.take_along_axis(srt, n_keep - 1, axis=-1)
    pth = jnp.where(top_p >= 1.0, -jnp.inf, pth)
    thr = jnp.maximum(kth, pth)
    return jnp.where(logits >= thr, logits, -jnp.inf)


def _logits(seed, rows=24, v=2000):
    """Rows from nearly flat to peaked (nucleus from ~all of V down to a handful of ids), some with ties."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    scale = jnp.geomspace(0.05, 8.0, rows)[:, None]
    x = jax.random.normal(k1, (rows, v)) * scale
    ties = jnp.round(x * 2.0) / 2.0  # heavy ties (every value shared by many ids)
    return jnp.where((jnp.arange(rows) % 3 == 0)[:, None], ties, x)


ref_jit = jax.jit(sorted_reference)
new_jit = jax.jit(sampling.filter_logits, static_argnames="k0")


@pytest.mark.parametrize("k0", [8, 64])
def test_kept_set_equals_sorted_reference(k0):
    x = _logits(0)
    for top_k, top_p in itertools.product([0, 1, 50, 100, 5000], [0.9, 0.5, 1.0, 0.999]):
        tk, tp = jnp.int32(top_k), jnp.float32(top_p)
        want = ref_jit(x, tk, tp)
        got = new_jit(x, tk, tp, k0=k0)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=f"{top_k=} {top_p=}")
        np.testing.assert_array_equal(
            np.where(np.isfinite(got), got, 0), np.where(np.isfinite(want), want, 0)
        )


def test_top_p_one_keeps_every_id():
    x = _logits(0)
    assert np.isfinite(new_jit(x, jnp.int32(0), jnp.float32(1.0))).all()
    assert np.isfinite(new_jit(x, jnp.int32(5000), jnp.float32(1.0))).sum(-1).min() == 2000


def test_both_paths_are_exercised():
    """The rows above end their nucleus both inside and beyond k0 (else the bisection would be untested)."""
    x = _logits(0)
    for top_p in (0.5, 0.9):
        kept = np.isfinite(ref_jit(x, jnp.int32(0), jnp.float32(top_p))).sum(-1)
        assert kept.min() <= 8 and kept.max() > 64, (top_p, kept)


def test_large_vocab_many_seeds():
    v = 49152
    for seed in range(3):
        x = (
            jax.random.normal(jax.random.PRNGKey(10 + seed), (8, v))
            * jnp.array([0.3, 1, 2, 3, 4, 5, 6, 8])[:, None]
        )
        for top_k, top_p in [(0, 0.9), (0, 0.5), (50, 0.9), (1, 1.0), (200, 1.0), (50, 0.95)]:
            tk, tp = jnp.int32(top_k), jnp.float32(top_p)
            np.testing.assert_array_equal(
                np.isfinite(new_jit(x, tk, tp)), np.isfinite(ref_jit(x, tk, tp)), err_msg=f"{top_k=} {top_p=}"
            )


def test_literal_cases_and_infinite_logits():
    lg = jnp.array([[3.0, 2.0, 1.0, 0.0]])
    keep = lambda k, p, **kw: np.isfinite(new_jit(lg, jnp.int32(k), jnp.float32(p), **kw))[0]  # noqa: E731
    # softmax([3,2,1,0]) = [0.644, 0.237, 0.087, 0.032]
    np.testing.assert_array_equal(keep(2, 1.0), [1, 1, 0, 0])
    np.testing.assert_array_equal(keep(0, 0.7), [1, 1, 0, 0])
    np.testing.assert_array_equal(keep(0, 0.5), [1, 0, 0, 0])
    np.testing.assert_array_equal(keep(0, 0.95), [1, 1, 1, 0])
    np.testing.assert_array_equal(keep(0, 0.95, k0=1), [1, 1, 1, 0])  # nucleus beyond k0: bisection
    np.testing.assert_array_equal(keep(3, 1.0, k0=1), [1, 1, 1, 0])  # k beyond k0: bisection
    np.testing.assert_array_equal(keep(9, 1.0, k0=1), [1, 1, 1, 1])  # k > V keeps all
    tied = jnp.array([[1.0, 2.0, 2.0, 2.0, 0.0, -0.0]])
    np.testing.assert_array_equal(
        np.isfinite(new_jit(tied, jnp.int32(1), jnp.float32(1.0)))[0], [0, 1, 1, 1, 0, 0]
    )
    np.testing.assert_array_equal(  # ties with the k-th value are all kept; -0.0 ties with +0.0
        np.isfinite(new_jit(tied, jnp.int32(5), jnp.float32(1.0), k0=2))[0], [1, 1, 1, 1, 1, 1]
    )
    masked = jnp.array([[0.5, -jnp.inf, 0.2, -jnp.inf, 0.1]])
    for k, p in [(2, 1.0), (0, 0.6), (4, 1.0), (0, 0.999)]:
        for k0 in (1, 5):
            np.testing.assert_array_equal(
                np.isfinite(new_jit(masked, jnp.int32(k), jnp.float32(p), k0=k0)),
                np.isfinite(ref_jit(masked, jnp.int32(k), jnp.float32(p))),
                err_msg=f"{k=} {p=} {k0=}",
            )


def test_vmapped_as_in_sample_members_and_no_recompile():
    """sample_members vmaps choose_tokens over members (top_k / top_p unbatched): same kept sets."""
    x = _logits(1, rows=12).reshape(3, 4, -1)
    f = jax.jit(jax.vmap(sampling.filter_logits, in_axes=(0, None, None)))
    for top_k, top_p in [(0, 0.9), (50, 0.5), (100, 1.0), (1, 0.9)]:
        tk, tp = jnp.int32(top_k), jnp.float32(top_p)
        np.testing.assert_array_equal(np.isfinite(f(x, tk, tp)), np.isfinite(ref_jit(x, tk, tp)))
    assert f._cache_size() == 1


def test_sampler_samples_only_kept_tokens():
    """choose_tokens draws from the filtered set, and its logp is the behaviour log-prob of that draw: the
    log_softmax of the filtered (truncated, renormalised) logits, not the untruncated softmax (issue 23.9)."""
    x = _logits(2, rows=6, v=500)
    sp = sampling.sampling_params(temperature=1.0, top_k=0, top_p=0.5)
    filt = sorted_reference(x, sp.top_k, sp.top_p)
    keep = np.isfinite(filt)
    lsm_trunc = jax.nn.log_softmax(filt, -1)
    lsm = jax.nn.log_softmax(x, -1)
    kept_mass = np.sum(np.exp(np.asarray(lsm, np.float64)) * keep, -1)  # row 0 is all ties: all kept, mass 1
    assert kept_mass[1:].max() < 0.9
    choose = jax.jit(sampling.choose_tokens)
    for s in range(20):
        tok, lp = choose(x, jax.random.PRNGKey(s), sp)
        assert keep[np.arange(6), np.asarray(tok)].all()
        np.testing.assert_allclose(lp, jnp.take_along_axis(lsm_trunc, tok[:, None], -1)[:, 0], atol=1e-6)
        untrunc = jnp.take_along_axis(lsm, tok[:, None], -1)[:, 0]
        # the truncation is visible: logp − untruncated logp = −log(kept mass)
        np.testing.assert_allclose(np.asarray(lp) - np.asarray(untrunc), -np.log(kept_mass), atol=1e-5)


def test_generation_stops_at_any_of_several_eos_ids():
    """eos_id may be a tuple (SmolLM2: <|im_end|> and <|endoftext|>): a sample ends at the first of them."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax.policies import sampling
    from grpo_jax.policies import transformer as tfm

    cfg = tfm.TransformerConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    params = tfm.init_params(cfg, jax.random.PRNGKey(0))
    prompt, pmask = jnp.full((2, 3), 3, jnp.int32), jnp.ones((2, 3), jnp.int32)
    sp = sampling.sampling_params(1.0)
    one = sampling.make_sampler(cfg, group=16, max_new=12, eos_id=1, pad_id=0)(
        params, prompt, pmask, jax.random.PRNGKey(1), sp
    )
    two = sampling.make_sampler(cfg, group=16, max_new=12, eos_id=(1, 2), pad_id=0)(
        params, prompt, pmask, jax.random.PRNGKey(1), sp
    )
    toks, mask = np.asarray(two.tokens), np.asarray(two.mask)
    for row, m in zip(toks.reshape(-1, 12), mask.reshape(-1, 12), strict=True):
        ids = row[m > 0]
        stops = np.flatnonzero(np.isin(ids, (1, 2)))
        assert stops.size == 0 or stops[0] == len(ids) - 1  # nothing after the first stop id
    # the same draws: up to the first 2 the two samplers agree, and 2 now ends samples that id 1 alone did not
    assert (np.asarray(two.lengths) <= np.asarray(one.lengths)).all()
    assert (np.asarray(two.lengths) < np.asarray(one.lengths)).any()
    assert np.asarray(two.truncated).sum() <= np.asarray(one.truncated).sum()


# ---------------------------------------------------------- sample_categorical (two-level inverse CDF)


@pytest.mark.parametrize(
    "u1, u2, want",
    [  # blocks [[0.1, 0.0], [0.3, 0.6]]: block sums 0.1, 0.9, running C = 0.1, 1.0
        (0.05, 1.0, 0),  # block 0 (0.05 <= 0.1); inside it c = 0.1, 0.1: id 0, never the zero-mass id 1
        (0.05, 0.5, 0),
        (0.10, 1.0, 0),  # the boundary u1 * C = C[0] belongs to block 0 (C[b-1] < x <= C[b])
        (0.50, 0.30, 2),  # block 1; c = 0.3, 0.9, u2 * 0.9 = 0.27 <= 0.3: id 2 * 1 + 0
        (0.50, 0.50, 3),  # 0.45 > 0.3: id 3
        (1.00, 1.00, 3),  # the top of the last block
    ],
)
def test_inverse_cdf_literal_values(u1, u2, want):
    blocks = jnp.asarray([[0.1, 0.0], [0.3, 0.6]], jnp.float32)
    got = sampling._inverse_cdf(blocks, jnp.float32(u1), jnp.float32(u2))
    assert int(got) == want


def test_sample_categorical_matches_softmax_and_never_draws_masked_ids():
    """300 ids (not a multiple of the 256-id block: the padding is never drawn), a third of them -inf, a
    wide range of logits: 100 000 draws per row against softmax; every frequency within 5 standard errors
    (+ 1e-4), the -inf ids never, and an id of mass ~0.9 in a peaked row."""
    v, n = 300, 100_000
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(k1, (2, v)) * jnp.asarray([[1.0], [4.0]])
    x = jnp.where(jnp.arange(v) % 3 == 1, -jnp.inf, x)
    x = x.at[1, 299].set(30.0)  # row 1: one dominant id in the last, partial block
    rows = jnp.broadcast_to(x[:, None, :], (2, n, v))
    draws = np.asarray(jax.jit(sampling.sample_categorical)(k2, rows))
    p = np.asarray(jax.nn.softmax(x, axis=-1), np.float64)
    for r in range(2):
        freq = np.bincount(draws[r], minlength=v) / n
        assert freq.shape == (v,)  # no id >= v (the padded tail) was drawn
        assert freq[1::3].sum() == 0.0  # the -inf ids
        se = np.sqrt(p[r] * (1 - p[r]) / n)
        assert np.all(np.abs(freq - p[r]) <= 5 * se + 1e-4), np.max(np.abs(freq - p[r]) / (se + 1e-12))
    assert 0.9 < p[1, 299] and abs(freq[299] - p[1, 299]) < 0.01


# ---------------------------------------------------------- the bf16 sampler's two decode loops


def test_bf16_decode_in_two_loops_gives_the_one_loop_draws(monkeypatch):
    """Below float32 `sample` decodes the first max_new // 2 tokens on a half-length completion cache, then
    grows it (tfm.grow_cache) for the rest. Against one loop over the full cache (SPLIT_DECODE_MIN above
    max_new): the same tokens, mask and lengths, log-probs within float rounding (the attention's sums run
    over fewer masked slots), and `with_cache` gives the full-length cache in the canonical layout, equal
    on every written slot and zero beyond (rows that ended early included)."""
    from grpo_jax.policies import transformer as tfm

    cfg = tfm.TransformerConfig(
        vocab_size=8,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        compute_dtype="bfloat16",
        init_std=0.5,  # large weights: the attention moves the logits (near-uniform ones hide a bad cache)
    )  # 8 ids: EOS ends rows in both loops
    params = tfm.init_params(cfg, jax.random.PRNGKey(0))
    prompt = jnp.asarray([[0, 0, 5, 6], [7, 4, 2, 5]], jnp.int32)
    pmask = (prompt > 0).astype(jnp.int32)
    sp = sampling.sampling_params(1.0)

    def run(split_min):
        monkeypatch.setattr(sampling, "SPLIT_DECODE_MIN", split_min)
        sampling.make_sampler.cache_clear()  # a new sampler, traced with this setting
        fn = sampling.make_sampler(cfg, group=8, max_new=16, eos_id=3, pad_id=0, with_cache=True)
        return fn(params, prompt, pmask, jax.random.PRNGKey(2), sp)

    (two, c2), (one, c1) = run(16), run(17)  # max_new = 16: split at 16, not at 17
    sampling.make_sampler.cache_clear()  # no sampler of the patched setting outlives the test
    np.testing.assert_array_equal(np.asarray(two.tokens), np.asarray(one.tokens))
    np.testing.assert_array_equal(np.asarray(two.mask), np.asarray(one.mask))
    lengths = np.asarray(two.lengths)
    assert 0 < lengths.min() < 8 and lengths.max() == 16, lengths  # rows ending in both loops
    np.testing.assert_allclose(np.asarray(two.logp), np.asarray(one.logp), atol=1e-5)
    for a, b in zip(c2.comp_k + c2.comp_v, c1.comp_k + c1.comp_v, strict=True):
        assert a.shape == b.shape == (2, 8, 2, 16, 8)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
