"""The pool timing shared by `experiments.bench_pool` (the pool's own benchmark) and `experiments.bench` (its
K = 16 figure): full-parameter members vmapped, and LoRA members of one base batched on the base, each
against a Python loop over members (see bench_pool's docstring for the workload). No flags here, so both
benchmarks can import it."""

from __future__ import annotations

import statistics
import time


def median_time(fn, repeats):
    import jax

    jax.block_until_ready(fn())  # warm-up (compile)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


QUICKSTART = dict(  # the quickstart model (experiments/flagfiles/quickstart.flags)
    vocab_size=512, d_model=128, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=384, tie_embeddings=False
)


def measure(
    k: int,
    *,
    prompts: int = 16,
    group: int = 8,
    samples: int = 1,
    prompt_len: int = 128,
    new_tokens: int = 24,
    repeats: int = 3,
    lora_rank: int = 8,
    with_lora: bool = True,
) -> list[dict]:
    """The pool figures at K = k on the quickstart model (also called by experiments.bench): one row for
    full-parameter members (vmapped) and, with_lora, one for LoRA members of one base (batched). Each row
    gives times, ratios (vmapped or batched / loop) and the FLOP rate the loop reaches (loop_gflops)."""
    import jax
    import jax.numpy as jnp

    from grpo_jax import pool
    from grpo_jax.policies import lora, sampling
    from grpo_jax.policies import transformer as tfm

    cfg = tfm.TransformerConfig(**QUICKSTART)
    b, g, s, p, t = prompts, group, samples, prompt_len, new_tokens
    eos = -1  # never emitted: every sample runs all T decode steps
    prompt = jax.random.randint(jax.random.PRNGKey(1), (b, p), 3, cfg.vocab_size)
    pmask = jnp.ones((b, p), jnp.int32)
    comps = jax.random.randint(jax.random.PRNGKey(2), (b, g, t), 3, cfg.vocab_size)
    # forward FLOPs per member: the prompt encoded once per prompt, then the completion tokens
    prompt_flops = b * p * cfg.matmul_flops_per_token(p // 2)
    flops = k * (
        2 * prompt_flops
        + b * g * t * cfg.matmul_flops_per_token(p + t // 2)
        + b * s * t * cfg.matmul_flops_per_token(p + t // 2)
    )

    def logp_fn(params, prompt, pmask, comps):
        return tfm.token_logp(tfm.forward_grouped(params, cfg, prompt, pmask, comps)[0], comps)[0]

    def row(kind, t_vl, t_ll, t_vs, t_ls):
        return dict(
            members=kind,
            K=k,
            logp_vmap_s=round(t_vl, 4),
            logp_loop_s=round(t_ll, 4),
            logp_ratio=round(t_vl / t_ll, 3),
            sample_vmap_s=round(t_vs, 4),
            sample_loop_s=round(t_ls, 4),
            sample_ratio=round(t_vs / t_ls, 3),
            eval_ratio=round((t_vl + t_vs) / (t_ll + t_ls), 3),
            loop_gflops=round(flops / (t_ll + t_ls) / 1e9, 1),
        )

    members = [tfm.init_params(cfg, jax.random.PRNGKey(100 + i)) for i in range(k)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *members)
    vm_logp = jax.jit(lambda st: pool.member_logp(logp_fn, st, prompt, pmask, comps))
    one_logp = jax.jit(logp_fn)
    t_vl = median_time(lambda: vm_logp(stacked), repeats)
    t_ll = median_time(lambda: [one_logp(m, prompt, pmask, comps) for m in members], repeats)

    msample = pool.make_member_sampler(cfg, group=s, max_new=t, eos_id=eos, pad_id=0)
    idx = jnp.arange(k, dtype=jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(3), k)
    temps = jnp.ones((k,), jnp.float32)
    t_vs = median_time(
        lambda: msample(stacked, idx, None, prompt, pmask, keys, temps, jnp.int32(0), jnp.float32(1.0)),
        repeats,
    )
    single = sampling.make_sampler(cfg, group=s, max_new=t, eos_id=eos, pad_id=0)
    sp = sampling.sampling_params(1.0)
    t_ls = median_time(
        lambda: [single(m, prompt, pmask, keys[i], sp) for i, m in enumerate(members)], repeats
    )
    rows = [row("full", t_vl, t_ll, t_vs, t_ls)]
    # the floor of any member batching on this machine: ONE model on the K*B rows the batched pool evaluates,
    # against K calls on B rows (the same FLOPs; > 1 means the bigger batch itself costs more per row)
    big = dict(
        prompt=jnp.tile(prompt, (k, 1)), pmask=jnp.tile(pmask, (k, 1)), comps=jnp.tile(comps, (k, 1, 1))
    )
    t_bigl = median_time(lambda: one_logp(members[0], big["prompt"], big["pmask"], big["comps"]), repeats)
    t_1l = median_time(lambda: one_logp(members[0], prompt, pmask, comps), repeats)
    big_sample = sampling.make_sampler(cfg, group=s, max_new=t, eos_id=eos, pad_id=0)
    t_bigs = median_time(lambda: big_sample(members[0], big["prompt"], big["pmask"], keys[0], sp), repeats)
    t_1s = median_time(lambda: single(members[0], prompt, pmask, keys[0], sp), repeats)
    rows[0].update(
        one_model_kb_rows_logp_ratio=round(t_bigl / (k * t_1l), 3),
        one_model_kb_rows_sample_ratio=round(t_bigs / (k * t_1s), 3),
    )
    if not with_lora:
        return rows
    # LoRA members of one base: one batch of K*B member-major rows on the shared base
    # (pool.lora_member_logp, make_member_sampler(lora_alpha=...)) against a loop over the members FOLDED
    # into full models outside the timing (W + A B alpha / r: the loop's best case, no adapter matmuls)
    base = members[0]
    ads = [
        jax.tree.map(
            lambda x, i=i: x + 0.02 * jax.random.normal(jax.random.PRNGKey(500 + i), x.shape),
            lora.init(base, jax.random.PRNGKey(200 + i), rank=lora_rank),
        )
        for i in range(k)
    ]
    st_ad = jax.tree.map(lambda *xs: jnp.stack(xs), *ads)
    folded = jax.block_until_ready([lora.fold(base, a) for a in ads])
    b_logp = jax.jit(lambda a: pool.lora_member_logp(logp_fn, base, a, 16.0, prompt, pmask, comps))
    t_bl = median_time(lambda: b_logp(st_ad), repeats)
    t_fl = median_time(lambda: [one_logp(m, prompt, pmask, comps) for m in folded], repeats)
    lsample = pool.make_member_sampler(cfg, group=s, max_new=t, eos_id=eos, pad_id=0, lora_alpha=16.0)
    t_bs = median_time(
        lambda: lsample(st_ad, idx, base, prompt, pmask, keys, temps, jnp.int32(0), jnp.float32(1.0)),
        repeats,
    )
    t_fs = median_time(lambda: [single(m, prompt, pmask, keys[i], sp) for i, m in enumerate(folded)], repeats)
    rows.append(row(f"lora_r{lora_rank}", t_bl, t_fl, t_bs, t_fs))
    return rows
