"""The rollout engines (grpo_jax.rollout.engines): both conform to the one protocol (shapes, masks, lengths,
truncation, behaviour log-probs equal to the trainer's), draw from the same distribution (greedy: the same
tokens; sampled: the softmax), the continuous engine's tokens do not depend on the slot count or the chunk
length, multi-turn continuation (select / extend / from_tokens) has the trainer's log-probs on the packed
conversation, and bf16 rollouts, LoRA parameters and a 2-device mesh work."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.eval.inputs import ROLLOUT_ENGINES as EVAL_ENGINES
from grpo_jax.policies import lora, sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.continuous import ROLLOUT_ENGINES
from grpo_jax.rollout.engines import ENGINES, ContinuousEngine, StaticEngine, make_engine

CFG = tfm.TransformerConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
EOS, PAD, T = 3, 0, 10
PROMPT = np.asarray([[0, 0, 7, 8, 9, 10], [0, 11, 12, 13, 14, 15], [16, 17, 18, 19, 20, 21]], np.int32)
PMASK = (PROMPT > 0).astype(np.int32)


@pytest.fixture(scope="module")
def params():
    return tfm.init_params(CFG, jax.random.key(0))


def engines(dtype="float32", **kw):
    common = dict(max_new=T, eos_ids=(EOS,), pad_id=PAD, weights_dtype=dtype)
    return {
        "static": StaticEngine(CFG, **common),
        "continuous": ContinuousEngine(CFG, slots=kw.get("slots", 4), chunk=kw.get("chunk", 3), **common),
    }


def trainer_logp(params, out, temperature=1.0):
    """The train step's log-probs of the sampled tokens (forward_grouped over the shared prompts)."""
    logits, _ = tfm.forward_grouped(params, CFG, jnp.asarray(PROMPT), jnp.asarray(PMASK), out.tokens)
    return np.asarray(tfm.token_logp(logits, out.tokens, temperature)[0])


def test_engine_choices_are_one_list():
    assert ENGINES == ROLLOUT_ENGINES == EVAL_ENGINES == ("static", "continuous")
    with pytest.raises(ValueError, match="rollout engine 'fast': valid: static, continuous"):
        make_engine("fast", CFG, max_new=T, eos_ids=(EOS,), pad_id=PAD)


@pytest.mark.parametrize("kind", ENGINES)
def test_generate_conforms_and_has_the_trainers_log_probs(params, kind):
    eng = engines()[kind]
    sp = sampling.sampling_params(0.7)
    out = eng.generate(params, PROMPT, PMASK, jax.random.key(3), n=4, sp=sp)
    assert out.tokens.shape == out.logp.shape == out.mask.shape == (3, 4, T)
    tokens, mask, lengths = (np.asarray(x) for x in (out.tokens, out.mask, out.lengths))
    np.testing.assert_array_equal(lengths, mask.sum(-1))
    np.testing.assert_array_equal(mask, np.arange(T) < lengths[..., None])  # a prefix of the row
    ended = np.take_along_axis(tokens, np.maximum(lengths - 1, 0)[..., None], -1)[..., 0] == EOS
    np.testing.assert_array_equal(np.asarray(out.truncated), ~ended)
    assert np.all(tokens[mask == 0] == PAD) and np.all(np.asarray(out.logp)[mask == 0] == 0)
    assert 0 < mask.sum() < mask.size  # some replies ended early, some ran to T
    want = trainer_logp(params, out, 0.7)
    np.testing.assert_allclose(np.asarray(out.logp) * mask, want * mask, atol=1e-5)
    st = eng.last_stats
    assert st["samples"] == 12 and st["useful_tokens"] == mask.sum() and st["row_steps"] >= mask.sum()


def test_greedy_tokens_are_the_same_on_both_engines(params):
    sp = sampling.sampling_params(0.0)
    outs = [e.generate(params, PROMPT, PMASK, jax.random.key(1), n=2, sp=sp) for e in engines().values()]
    for a, b in zip(outs[0], outs[1], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_continuous_tokens_do_not_depend_on_slots_or_chunks(params):
    sp = sampling.sampling_params(1.0)
    outs = []
    for slots, chunk in ((1, 1), (2, 3), (5, 4), (16, 16)):
        eng = ContinuousEngine(
            CFG, max_new=T, eos_ids=(EOS,), pad_id=PAD, slots=slots, chunk=chunk, min_slots=1
        )
        outs.append(eng.generate(params, PROMPT, PMASK, jax.random.key(5), n=4, sp=sp))
        assert eng.last_stats["decode_steps"] >= T  # every slot count ran the whole queue
    for o in outs[1:]:
        np.testing.assert_array_equal(np.asarray(o.tokens), np.asarray(outs[0].tokens))
        np.testing.assert_allclose(np.asarray(o.logp), np.asarray(outs[0].logp), atol=1e-6)
    # and a different key draws different samples
    other = ContinuousEngine(CFG, max_new=T, eos_ids=(EOS,), pad_id=PAD, slots=4)
    o = other.generate(params, PROMPT, PMASK, jax.random.key(6), n=4, sp=sp)
    assert not np.array_equal(np.asarray(o.tokens), np.asarray(outs[0].tokens))


def _recording(prefill, shapes: list):
    def fn(w, prompt, prompt_mask):
        shapes.append(prompt.shape)
        return prefill(w, prompt=prompt, prompt_mask=prompt_mask)

    return fn


@pytest.mark.parametrize("n", [1, 4])
def test_continuous_prompts_encoded_in_blocks_draw_the_same_samples(params, monkeypatch, n):
    """With a prefill budget of one or two prompts (engines.PREFILL_SCORES_BYTES; [rows, heads, P, P] float32
    scores: 4 x 4 x 6 x 6 bytes a prompt here) 5 prompts are encoded in blocks, each once and no larger
    than the budget, as the queue reaches them (fills that straddle two blocks included): the same tokens
    and log-probs as one prefill of all of them."""
    from grpo_jax.rollout import engines as eng_mod

    prompt = np.r_[PROMPT, [[0, 0, 0, 22, 23, 24], [0, 25, 26, 27, 28, 29]]].astype(np.int32)
    sp = sampling.sampling_params(1.0)
    outs, calls = [], []
    for budget in (1 << 30, 4 * 4 * 6 * 6, 2 * 4 * 4 * 6 * 6):
        monkeypatch.setattr(eng_mod, "PREFILL_SCORES_BYTES", budget)
        eng = ContinuousEngine(CFG, max_new=T, eos_ids=(EOS,), pad_id=PAD, slots=5, chunk=2, min_slots=1)
        shapes = []
        eng._prefill = _recording(eng._prefill, shapes)
        pmask = (prompt > 0).astype(np.int32)
        outs.append(eng.generate(params, prompt, pmask, jax.random.key(5), n=n, sp=sp))
        calls.append(shapes)
    assert calls == [[(5, 6)], [(1, 6)] * 5, [(2, 6)] * 3]  # the last block padded to the block's rows
    for o in outs[1:]:
        np.testing.assert_array_equal(np.asarray(o.tokens), np.asarray(outs[0].tokens))
        np.testing.assert_allclose(np.asarray(o.logp), np.asarray(outs[0].logp), atol=1e-6)


@pytest.mark.parametrize("kind", ENGINES)
def test_first_token_frequencies_follow_the_softmax(params, kind):
    """1 prompt x 4000 samples at temperature 0.8 from a model with spread-out logits: the first token's
    counts against softmax(logits / 0.8) by Pearson's chi-square (39 degrees of freedom: 99.99 % below 80);
    the same counts against temperature 1 are far off (the test tells the two apart)."""
    sharp = {**params, "embed": params["embed"] * 6.0}  # the tied head: logits spread over several nats
    eng = engines(slots=256, chunk=4)[kind]
    out = eng.generate(
        sharp, PROMPT[:1], PMASK[:1], jax.random.key(9), n=4000, sp=sampling.sampling_params(0.8)
    )
    counts = np.bincount(np.asarray(out.tokens)[0, :, 0], minlength=CFG.vocab_size)
    logits, _ = tfm.forward(sharp, CFG, jnp.asarray(PROMPT[:1]), jnp.asarray(PMASK[:1]))

    def chi2(temperature):
        expected = 4000 * np.asarray(jax.nn.softmax(logits[0, -1] / temperature), np.float64)
        return float(np.sum((counts - expected) ** 2 / expected))

    assert chi2(0.8) < 80 and chi2(1.0) > 200, (chi2(0.8), chi2(1.0))


def _packed_turn2_logp(params, prompt, pmask, first, conv_rows, fb, fmask, out2):
    """The trainer's log-probs of reply 2 on the packed conversation prompt | reply 1 | feedback | reply 2."""
    g = first.tokens.shape[1]
    lp = []
    for i, r in enumerate(conv_rows):
        b, j = divmod(int(r), g)
        seq = list(prompt[b][pmask[b] > 0])
        seq += list(np.asarray(first.tokens)[b, j, : int(first.lengths[b, j])])
        seq += list(fb[i][fmask[i] > 0])
        start, n2 = len(seq), int(out2.lengths[i, 0])
        seq += list(np.asarray(out2.tokens)[i, 0, :n2])
        toks = jnp.asarray([seq], jnp.int32)
        logits, _ = tfm.forward(params, CFG, toks, jnp.ones_like(toks))
        lsm = np.asarray(jax.nn.log_softmax(logits[0], -1))
        lp.append([lsm[start + k - 1, seq[start + k]] for k in range(n2)])
    return lp


@pytest.mark.parametrize("kind", ENGINES)
def test_later_turns_have_the_trainers_log_probs_on_the_packed_conversation(params, kind):
    eng = engines()[kind]
    sp = sampling.sampling_params(1.0)
    first, conv = eng.generate_kept(params, PROMPT, PMASK, jax.random.key(2), n=2, sp=sp)
    rows = np.asarray([5, 0, 3])
    fb = np.asarray([[20, 21, 22, 0], [25, 26, 0, 0], [27, 28, 29, 30]], np.int32)
    fmask = (fb > 0).astype(np.int32)
    out2, conv2 = eng.extend(params, eng.select(conv, rows), fb, fmask, jax.random.key(4), sp=sp)
    assert out2.tokens.shape == (3, 1, T)
    want = _packed_turn2_logp(params, PROMPT, PMASK, first, rows, fb, fmask, out2)
    for i in range(3):
        n2 = int(out2.lengths[i, 0])
        np.testing.assert_allclose(np.asarray(out2.logp)[i, 0, :n2], want[i], atol=1e-5)
    # a third turn continues the second's conversations (rows of conv2)
    out3, _ = eng.extend(params, eng.select(conv2, [2, 0]), fb[:2], fmask[:2], jax.random.key(7), sp=sp)
    assert out3.tokens.shape == (2, 1, T) and int(np.asarray(out3.mask).sum()) > 0


def test_from_tokens_equals_extend_on_both_engines(params):
    """The same conversation given as tokens (evaluation's second turn) or continued from the kept one gives
    the same greedy reply on each engine."""
    greedy = sampling.sampling_params(0.0)
    for eng in engines().values():
        first, conv = eng.generate_kept(params, PROMPT, PMASK, jax.random.key(2), n=1, sp=greedy)
        fb = np.asarray([[20, 21, 0], [22, 0, 0], [23, 24, 25]], np.int32)
        fmask = (fb > 0).astype(np.int32)
        a, _ = eng.extend(params, eng.select(conv, [0, 1, 2]), fb, fmask, jax.random.key(4), sp=greedy)
        width = PROMPT.shape[1] + T + fb.shape[1]
        ctx, cmask = np.zeros((3, width), np.int32), np.zeros((3, width), np.int32)
        for b in range(3):
            seq = np.r_[PROMPT[b][PMASK[b] > 0], np.asarray(first.tokens)[b, 0, : int(first.lengths[b, 0])]]
            seq = np.r_[seq, fb[b][fmask[b] > 0]]
            ctx[b, width - seq.size :], cmask[b, width - seq.size :] = seq, 1
        c, _ = eng.from_tokens(params, ctx, cmask, jax.random.key(4), sp=greedy)
        np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


def test_bf16_rollouts_and_lora_parameters(params):
    """bf16 weights: the continuous engine's log-probs are the float32 trainer's to bf16 rounding (as the
    static engine's); LoRA adapters merged over the base sample like the merged model."""
    sp = sampling.sampling_params(1.0)
    for kind, eng in engines("bfloat16").items():
        out = eng.generate(params, PROMPT, PMASK, jax.random.key(3), n=2, sp=sp)
        m = np.asarray(out.mask)
        err = np.abs(np.asarray(out.logp) - trainer_logp(params, out)) * m
        assert err.max() < 3e-2, kind
    ad = lora.init(params, jax.random.key(8), rank=2, targets=("q_proj", "v_proj"))
    ad = jax.tree.map(lambda x: x + 0.05, ad)
    merged = lora.merge(params, ad, alpha=4.0)
    eng = engines()["continuous"]
    out = eng.generate(merged, PROMPT, PMASK, jax.random.key(3), n=2, sp=sp)
    m = np.asarray(out.mask)
    np.testing.assert_allclose(np.asarray(out.logp) * m, trainer_logp(merged, out) * m, atol=1e-5)


_MESH_CHILD = r"""
import jax, jax.numpy as jnp, numpy as np
from grpo_jax.policies import sampling, transformer as tfm
from grpo_jax.rollout.engines import ContinuousEngine
from grpo_jax.runtime import sharding
cfg = tfm.TransformerConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
params = tfm.init_params(cfg, jax.random.key(0))
prompt = np.asarray([[0, 0, 7, 8], [0, 11, 12, 13], [16, 17, 18, 19], [5, 6, 7, 8]], np.int32)
pmask = (prompt > 0).astype(np.int32)
eng = ContinuousEngine(cfg, max_new=8, eos_ids=(3,), pad_id=0, slots=4, chunk=3)
sp = sampling.sampling_params(1.0)
one = eng.generate(params, prompt, pmask, jax.random.key(1), n=2, sp=sp)
mesh = sharding.make_mesh(data=2)
sh = sharding.tree_shardings(params, mesh)
p2 = sharding.put(params, sh)
pr, pm = sharding.put((prompt, pmask), sharding.batch_sharding(mesh))
two = eng.generate(p2, pr, pm, jax.random.key(1), n=2, sp=sp)
assert jax.device_count() == 2
np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(two.tokens))
print("ok", int(np.asarray(two.mask).sum()))
"""


def test_continuous_engine_on_a_two_device_mesh():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root
    r = subprocess.run(
        [sys.executable, "-c", _MESH_CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-3000:]


def test_main_job_on_the_continuous_engine_with_packing_resumes_bit_identically(tmp_path):
    """The main job with --rollout_engine=continuous, the packed update and 2-turn trajectories: it logs the
    engine's padding figure and the packed rows; killed with SIGKILL after its step-4 checkpoint, the same
    command resumes and ends with the uninterrupted run's final parameters."""
    import mainjob

    args = (mainjob.TINY, "--rollout_engine=continuous", "--engine_slots=8", "--engine_chunk=4")
    args += ("--pack_tokens=192", "--max_turns=2", "--feedback_tokens=96")
    with mainjob.executor() as ex:
        ref, _ = mainjob.run(*args, workdir=tmp_path / "ref", executor=ex)
    m = mainjob.metrics(tmp_path / "ref")
    assert sorted(m) == [1, 2, 3, 4, 5, 6]
    assert all(0.0 <= m[s]["rollout/padding_fraction"] < 1.0 and m[s]["pack/rows"] >= 1 for s in m)
    assert all(0.0 < m[s]["pack/padding_fraction"] < 1.0 for s in m)
    assert m[1]["logp_mismatch"] < 1e-5  # the engine's behaviour log-probs are the packed trainer's
    wd = tmp_path / "killed"
    got = mainjob.killed_and_resumed(*args, workdir=wd, step=4)
    assert got["final_params_sha256"] == ref["final_params_sha256"]
