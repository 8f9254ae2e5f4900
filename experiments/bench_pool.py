"""Benchmark of the policy pool: vmapped evaluation of K stacked members against a Python loop over members,
and the pool's memory with full parameters against LoRA adapters.

    python -m experiments.bench_pool                       # K = 8, 16, 32 on the quickstart model
    python -m experiments.bench_pool --ks=16 --repeats=5

Workload = what the code-generation loop does per step with `--baseline=pool`: every member draws
`samples` completions of `prompts` prompts (KV-cache sampler, `new_tokens` tokens, no early EOS), and the
log-probabilities of one batch (prompts x group completions) under every member. "vmap" is one jitted call
over the stacked pool (grpo_jax.pool); "loop" calls the same jitted single-member function once per member
(members pre-sliced outside the timing, compile excluded: the loop's best case). Times are medians over
`repeats` calls after one warm-up call.

Prints one JSON line per figure and a table: per K, logp_vmap_s / logp_loop_s / ratio and sample_vmap_s /
sample_loop_s / ratio (ratio = vmap time / loop time; the target is <= 0.5 at K = 16); then pool memory (MB,
float32) with full parameters and with rank-r LoRA adapters for the quickstart, TINY and SMALL models.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app, flags

flags.DEFINE_list("ks", ["8", "16", "32"], "Pool sizes K to time.")
flags.DEFINE_integer("prompts", 16, "Prompts per step (B).", lower_bound=1)
flags.DEFINE_integer("group", 8, "Completions per prompt in the log-prob batch (G).", lower_bound=1)
flags.DEFINE_integer("samples", 1, "Completions per prompt each member samples.", lower_bound=1)
flags.DEFINE_integer("prompt_len", 128, "Prompt tokens (P).", lower_bound=1)
flags.DEFINE_integer("new_tokens", 24, "New tokens per completion (T).", lower_bound=1)
flags.DEFINE_integer("repeats", 3, "Timed calls per figure (median).", lower_bound=1)
flags.DEFINE_integer("lora_rank", 8, "LoRA rank for the memory figure.", lower_bound=1)
FLAGS = flags.FLAGS


def emit(**kw):
    print(json.dumps(kw), flush=True)


def median_time(fn, repeats):
    import jax

    jax.block_until_ready(fn())  # warm-up (compile)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp

    from grpo_jax import pool
    from grpo_jax.policies import lora, sampling
    from grpo_jax.policies import transformer as tfm

    cfg = tfm.TransformerConfig(  # the quickstart model (experiments/flagfiles/quickstart.flags)
        vocab_size=512, d_model=128, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=384, tie_embeddings=False
    )
    b, g, s, p, t = FLAGS.prompts, FLAGS.group, FLAGS.samples, FLAGS.prompt_len, FLAGS.new_tokens
    eos = -1  # never emitted: every sample runs all T decode steps
    prompt = jax.random.randint(jax.random.PRNGKey(1), (b, p), 3, cfg.vocab_size)
    pmask = jnp.ones((b, p), jnp.int32)
    comps = jax.random.randint(jax.random.PRNGKey(2), (b, g, t), 3, cfg.vocab_size)
    emit(
        setting="bench_pool",
        model_params=cfg.num_params(),
        prompts=b,
        group=g,
        samples=s,
        prompt_len=p,
        new_tokens=t,
        devices=str(jax.devices()),
    )

    def logp_fn(params, prompt, pmask, comps):
        return tfm.token_logp(tfm.forward_grouped(params, cfg, prompt, pmask, comps)[0], comps)[0]

    def measure(k):
        members = [tfm.init_params(cfg, jax.random.PRNGKey(100 + i)) for i in range(k)]
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *members)
        vm_logp = jax.jit(lambda st: pool.member_logp(logp_fn, st, prompt, pmask, comps))
        one_logp = jax.jit(logp_fn)
        t_vl = median_time(lambda: vm_logp(stacked), FLAGS.repeats)
        t_ll = median_time(lambda: [one_logp(m, prompt, pmask, comps) for m in members], FLAGS.repeats)

        msample = pool.make_member_sampler(cfg, group=s, max_new=t, eos_id=eos, pad_id=0)
        idx = jnp.arange(k, dtype=jnp.int32)
        keys = jax.random.split(jax.random.PRNGKey(3), k)
        temps = jnp.ones((k,), jnp.float32)
        t_vs = median_time(
            lambda: msample(stacked, idx, None, prompt, pmask, keys, temps, jnp.int32(0), jnp.float32(1.0)),
            FLAGS.repeats,
        )
        single = sampling.make_sampler(cfg, group=s, max_new=t, eos_id=eos, pad_id=0)
        sp = sampling.sampling_params(1.0)
        t_ls = median_time(
            lambda: [single(m, prompt, pmask, keys[i], sp) for i, m in enumerate(members)], FLAGS.repeats
        )
        row = dict(
            K=k,
            logp_vmap_s=round(t_vl, 4),
            logp_loop_s=round(t_ll, 4),
            logp_ratio=round(t_vl / t_ll, 3),
            sample_vmap_s=round(t_vs, 4),
            sample_loop_s=round(t_ls, 4),
            sample_ratio=round(t_vs / t_ls, 3),
            eval_ratio=round((t_vl + t_vs) / (t_ll + t_ls), 3),
        )
        emit(**row)
        return row

    rows = [measure(int(x)) for x in FLAGS.ks]

    head = (
        f"{'K':>4} {'logp vmap':>10} {'loop':>8} {'ratio':>6}   {'sample vmap':>11} {'loop':>8} {'ratio':>6}"
    )
    print("\n" + head)
    for r in rows:
        print(
            f"{r['K']:>4} {r['logp_vmap_s']:>9.3f}s {r['logp_loop_s']:>7.3f}s {r['logp_ratio']:>6.2f}   "
            f"{r['sample_vmap_s']:>10.3f}s {r['sample_loop_s']:>7.3f}s {r['sample_ratio']:>6.2f}"
        )

    print(f"\npool memory (float32 MB), LoRA rank {FLAGS.lora_rank} on all 7 projections")
    for name, c in (("quickstart", cfg), ("TINY", tfm.TINY), ("SMALL", tfm.SMALL)):
        shapes = jax.eval_shape(lambda c=c: tfm.init_params(c, jax.random.PRNGKey(0)))
        adapters = jax.eval_shape(
            lambda sh=shapes: lora.init(sh, jax.random.PRNGKey(0), rank=FLAGS.lora_rank)
        )
        n_full = sum(x.size for x in jax.tree.leaves(shapes))
        n_ad = sum(x.size for x in jax.tree.leaves(adapters))
        for k in [int(x) for x in FLAGS.ks]:
            full_mb, lora_mb = 4 * k * n_full / 2**20, 4 * k * n_ad / 2**20
            emit(
                model=name,
                K=k,
                pool_full_mb=round(full_mb, 2),
                pool_lora_mb=round(lora_mb, 2),
                lora_fraction=round(n_ad / n_full, 4),
            )
        print(
            f"  {name:<11} params {n_full:>10,}  adapters {n_ad:>9,} ({n_ad / n_full:.1%}); "
            + ", ".join(
                f"K={k}: {4 * k * n_full / 2**20:.1f} vs {4 * k * n_ad / 2**20:.1f}"
                for k in [int(x) for x in FLAGS.ks]
            )
        )
    # the pool as actually allocated (checks the arithmetic above on the quickstart model)
    base = tfm.init_params(cfg, jax.random.PRNGKey(0))
    ad = lora.init(base, jax.random.PRNGKey(1), rank=FLAGS.lora_rank)
    k = int(FLAGS.ks[-1])
    nbytes = [sum(x.nbytes for x in jax.tree.leaves(pool.init(tree, k).params)) for tree in (base, ad)]
    emit(
        allocated_pool_full_mb=round(nbytes[0] / 2**20, 2),
        allocated_pool_lora_mb=round(nbytes[1] / 2**20, 2),
        K=k,
    )


if __name__ == "__main__":
    app.run(main)
