"""Benchmark of one full GRPO step: sampling, reference forward, policy forward/backward, AdamW.

    python -m experiments.bench                 # tiny, small, smollm2 and pool, one process each
    python -m experiments.bench --size=tiny --steps=5
    python -m experiments.bench --size=smollm2  # SmolLM2-135M-Instruct on the peer workload, per-phase table
    python -m experiments.bench --size=smollm2_random  # the same model on the random-prompt setting below
    python -m experiments.bench --size=pool     # the policy pool at K = 16: vmapped / batched vs a loop

Prints one JSON line per figure, first this device's rates: matmul_gflops (float32 GEMM, n = 1024 on CPU and
4096 on accelerators), matmul_bf16_gflops (bf16 operands, float32 accumulation: the products of mixed
precision) and bandwidth_gbs (bytes read + written by `x * 2` over 256 MiB), on any backend.

tiny / small / smollm2_random (issue #2's setting): Qwen2-style models (q/k/v bias, untied head;
smollm2_random: the real SmolLM2 with its chunked LM head) at 8 prompts x G=8, random prompts of 32 tokens,
64 new tokens (no early EOS: every step samples all 64), temperature 1.0, beta = 0.04 with a reference
model, float32, AdamW with global-norm clip 1.0.

smollm2: the workload grpo_jax is compared with TRL on (experiments/bench_phases.py: SmolLM2-135M-Instruct,
16 fixed coding prompts in its chat template, 4 x G = 8, up to 64 new tokens ending at EOS, beta 0.04, lr
1e-6), with every phase timed alone beside its floor on this device (phase_*_s with floor_s, a phase_table,
step_floor_s, generation_tokens_per_s, logp_mismatch_median). `--compute_dtype=bfloat16` trains in mixed
precision and `--rollout_dtype=bfloat16` samples from bf16 weights (the main job's flags of the same names);
the floors then use the bf16 matmul rate and the bf16 weight bytes. `--logp_chunk` sets the train step's
chunked head (default 0: full logits, as the TRL comparison ran).

Compilation: JAX's persistent cache is on (default directory, `--compilation_cache=DIR|none`), so
first_step_s of a second run of the same size shows the start-up a returning user sees;
`--compilation_cache=none` measures the cold compile.

Devices: with several (`--cpu_devices=N` splits the CPU backend, the main job's --mesh_cpu_devices; an
accelerator host's own) tiny / small / smollm2_random run each step data parallel over all of them (on an
accelerator host, over as many as divide --prompts, with a note), the state and batch placed as the main job
places them (grpo_jax.runtime.sharding); every figure names its `devices`.

Figures per size (tiny / small / smollm2_random): compilation_cache (its directory or
"off"), first_step_s (compile or cache load included),
step_s_median (sample + reward + train step), sampling_s_median, sampler_tokens_per_s, non_sampling_s_median
(the jitted train step: reference forward + policy forward/backward + update), reference_forward_s_median
(timed alone, for the breakdown), step_gflop (FLOPs executed, with the prompt encoded once per group),
step_gflop_unshared (what a trainer that repeats the prompt per sample would execute), achieved_gflops,
fraction_of_matmul_peak (those FLOPs at the matmul rate of their dtype, float32 or bf16, over the step),
peak_rss_mb (host), device_peak_mb (accelerators only: the device allocator's peak),
and with the device's rates (not with --nomatmul alone): prefill_s (the weight cast and the prefill, as the
sampler runs them), decode_per_token_s = (sampling - prefill) / T with its floor_s
(experiments.bench_phases.decode_floor_s: the weight copy and the KV cache read at the bandwidth, or the
FLOPs at the matmul rate), and decode_fraction_of_floor (floor / measured).
The pool workload (experiments.pool_timing, the loop's per-step pool
evaluation on the quickstart model, K = 16 members) prints pool_k16_logp_ratio, pool_k16_sample_ratio
(vmapped / loop time; full-parameter members) and pool_k16_lora_logp_ratio, pool_k16_lora_sample_ratio (LoRA
members batched on one shared base / a loop over the members folded into full models), each with its times,
pool_k16_one_model_kb_rows_{logp,sample}_ratio (ONE model on the K*B rows a batched pool evaluates / K calls
on B rows: the same FLOPs, so this is the floor of any member batching on the machine), and
pool_k16_loop_gflops (the loop's FLOP rate).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_enum(
    "size",
    "all",
    [
        "tiny",
        "small",
        "smollm2",
        "smollm2_random",
        "pool",
        "smollm2_varlen",
        "smollm2_eval",
        "multiturn",
        "all",
    ],
    "Workload: the random tiny / small Qwen2-style models; smollm2 = the real SmolLM2-135M-Instruct on the "
    "peer workload (experiments.bench_phases: 16 fixed coding prompts in its chat template, 4 x G = 8, "
    "64 new tokens ending at EOS, beta 0.04, lr 1e-6; per-phase times beside their floors); smollm2_random = "
    "the same model on the random-prompt setting of tiny / small (8 x 8, no EOS); pool = the policy pool at "
    "K = 16 (experiments.pool_timing); smollm2_varlen / smollm2_eval / multiturn = real reply lengths "
    "(experiments.bench_varlen: a GRPO step on MBPP train prompts at 512 new tokens, an evaluation "
    "stream of 128 MBPP test samples, the quickstart single vs 2 turns); 'all' = tiny, small, smollm2 and "
    "pool, each in its own process.",
)
flags.DEFINE_enum(
    "rollout_engine",
    None,
    ["static", "continuous"],
    "The rollout engine (the main job's --rollout_engine; default static; smollm2_eval: both, one process "
    "each).",
)
flags.DEFINE_integer("engine_slots", 32, "With --rollout_engine=continuous: decode slots.", lower_bound=1)
flags.DEFINE_integer(
    "engine_chunk", 16, "With --rollout_engine=continuous: decode steps per device call.", lower_bound=1
)
flags.DEFINE_integer(
    "pack_tokens",
    0,
    "The padding-free update's row width (the main job's --pack_tokens; 0 = the padded update).",
    lower_bound=0,
)
flags.DEFINE_integer(
    "pack_rows_per_doubling",
    2,
    "The packed update's row-count sizes per doubling (the main job's --pack_rows_per_doubling).",
    lower_bound=1,
)
flags.DEFINE_integer("steps", 5, "Timed steps after the first (compile) step.", lower_bound=1)
flags.DEFINE_integer("prompts", 8, "Prompts per step (B).", lower_bound=1)
flags.DEFINE_integer("group", 8, "Completions per prompt (G).", lower_bound=2)
flags.DEFINE_integer("prompt_len", 32, "Prompt tokens (P).", lower_bound=1)
flags.DEFINE_integer("new_tokens", 64, "New tokens per completion (T).", lower_bound=1)
flags.DEFINE_enum(
    "remat",
    None,
    ["none", "full", "dots", "dots_no_batch"],
    "Per-layer remat policy of the train step (transformer.REMAT_POLICIES); default: the main job's "
    "(--remat of experiments.codegen).",
)
flags.DEFINE_enum(
    "compute_dtype",
    "float32",
    ["float32", "bfloat16"],
    "The train step's compute dtype (--compute_dtype of experiments.codegen: float32 master weights, "
    "optimizer and losses either way; bfloat16 = mixed precision).",
)
flags.DEFINE_enum(
    "rollout_dtype",
    "float32",
    ["float32", "bfloat16"],
    "The sampler's weights and compute dtype (--rollout_dtype of experiments.codegen).",
)
flags.DEFINE_integer(
    "logp_chunk",
    0,
    "smollm2 only: the train step's chunked LM head (--logp_chunk; 0 = full logits).",
    lower_bound=0,
)
flags.DEFINE_integer(
    "cpu_devices",
    0,
    "tiny / small / smollm2_random on the CPU backend: split the cores into N JAX devices (the main job's "
    "--mesh_cpu_devices) and each step's prompts over them, data parallel as the main job's mesh does; 0 = "
    "JAX's default. On any backend with several devices the step runs data parallel over them (as many as "
    "divide --prompts).",
    lower_bound=0,
)
flags.DEFINE_bool("matmul", True, "Measure the machine's float32 matmul GFLOP/s first.")
flags.DEFINE_string(
    "compilation_cache",
    "",
    "JAX's persistent compilation cache (grpo_jax.runtime.compile_cache): empty = the default directory, "
    "'none' = off (first_step_s then always includes compilation).",
)
FLAGS = flags.FLAGS


def emit(**kw):
    print(json.dumps(kw), flush=True)


def bench_size(
    size: str,
    steps: int,
    B: int,
    G: int,
    P: int,
    T: int,
    rates: dict | None,
    remat: str,
    compute_dtype: str = "float32",
    rollout_dtype: str = "float32",
    engine_kind: str = "static",
    pack_tokens: int = 0,
):
    import dataclasses

    import jax
    import jax.numpy as jnp

    from grpo_jax.config import ObjectiveConfig, OptimConfig
    from grpo_jax.policies import sampling
    from grpo_jax.policies import transformer as tfm
    from grpo_jax.policies.logp import policy_logp_fn
    from grpo_jax.rollout.engines import make_engine
    from grpo_jax.runtime.memory import memory_metrics
    from grpo_jax.train.state import init_state, make_optimizer
    from grpo_jax.train.step import make_train_step
    from grpo_jax.types import batch_from_samples

    obj = ObjectiveConfig(kl_coef=0.04)
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-5, grad_clip=1.0))
    if size == "smollm2_random":  # the real model: its weights and vocabulary (49 152), the chunked LM head
        from grpo_jax.pretrained.api import load_pretrained

        cfg, params = load_pretrained("smollm2-135m-instruct")
    else:
        cfg = {"tiny": tfm.TINY, "small": tfm.SMALL}[size]
        params = tfm.init_params(cfg, jax.random.PRNGKey(0))
    chunk = 256 if size == "smollm2_random" else 0
    cfg = dataclasses.replace(cfg, remat=remat, logp_chunk=chunk, compute_dtype=compute_dtype)
    state = init_state(jax.device_put(params), obj, optimizer, seed=0)
    prompt = jax.random.randint(jax.random.PRNGKey(1), (B, P), 2, cfg.vocab_size)
    pmask = jnp.ones((B, P), jnp.int32)
    shardings = None
    n = jax.device_count()
    used = max(d for d in range(1, n + 1) if B % d == 0)  # an accelerator host: as many as divide B
    if used < n:
        print(f"note: the step runs on {used} of {n} devices (--prompts={B} split evenly)", file=sys.stderr)
    if used > 1:  # data parallel, the state and batch placed as the main job places them
        from grpo_jax.runtime import sharding

        mesh = sharding.make_mesh(devices=jax.devices()[:used])
        shardings = (sharding.tree_shardings(state, mesh), sharding.batch_sharding(mesh))
        state = sharding.put(state, shardings[0])
        prompt, pmask = sharding.put((prompt, pmask), shardings[1])
    train_step = make_train_step(
        cfg, obj, optimizer, temperature=1.0, shardings=shardings, pack_tokens=pack_tokens
    )
    engine = make_engine(
        engine_kind, cfg, max_new=T, eos_ids=(-1,), pad_id=0, weights_dtype=rollout_dtype,
        slots=FLAGS.engine_slots, chunk=FLAGS.engine_chunk,
    )  # fmt: skip
    sp = sampling.sampling_params(1.0)
    logp = policy_logp_fn(cfg)
    ref_fn = jax.jit(lambda p, pr, pm, c: logp(p, pr, pm, c, 1.0)[0])  # the reference pass alone

    def one_step(state, i):
        t0 = time.perf_counter()
        out = engine.generate(state.params, prompt, pmask, jax.random.PRNGKey(100 + i), n=G, sp=sp)
        out.tokens.block_until_ready()
        t1 = time.perf_counter()
        rewards = (out.tokens[..., 0] % 2).astype(jnp.float32)  # any non-constant reward
        batch = batch_from_samples(prompt, pmask, out, rewards)
        state, metrics, _ = train_step(state, batch)
        jax.block_until_ready(metrics)
        t2 = time.perf_counter()
        ref_t = time.perf_counter()
        ref_fn(state.ref_params, prompt, pmask, out.tokens).block_until_ready()
        ref_t = time.perf_counter() - ref_t
        return state, t1 - t0, t2 - t1, t2 - t0, ref_t

    state, _, _, first, _ = one_step(state, 0)  # sample + reward + train step (not the diagnostic ref pass)
    samp, non, tot, ref = [], [], [], []
    for i in range(steps):
        state, a, b, c, r = one_step(state, i + 1)
        samp.append(a)
        non.append(b)
        tot.append(c)
        ref.append(r)
    step_s = statistics.median(tot)
    # FLOPs executed: sampling (prefill B*P + decode B*G*T), reference forward, policy fwd+bwd (3x forward)
    fwd_prompt = B * P * cfg.matmul_flops_per_token(P // 2)
    fwd_comp = B * G * T * cfg.matmul_flops_per_token(P + T // 2)
    fwd = fwd_prompt + fwd_comp
    flops = fwd + fwd + 3 * fwd  # sampling, reference, policy fwd+bwd
    unshared = G * fwd_prompt * 5 + fwd_comp * 5
    common = dict(size=size, params=cfg.num_params(), B=B, G=G, P=P, T=T, backend=jax.default_backend())
    common.update(devices=used)
    common.update(remat=remat, compute_dtype=compute_dtype, rollout_dtype=rollout_dtype)
    common.update(engine=engine_kind, pack_tokens=pack_tokens)
    emit(figure="first_step_s", value=round(first, 3), **common)
    emit(figure="step_s_median", value=round(step_s, 3), **common)
    emit(figure="sampling_s_median", value=round(statistics.median(samp), 3), **common)
    emit(figure="sampler_tokens_per_s", value=round(B * G * T / statistics.median(samp), 1), **common)
    emit(figure="non_sampling_s_median", value=round(statistics.median(non), 3), **common)
    emit(figure="reference_forward_s_median", value=round(statistics.median(ref), 3), **common)
    emit(figure="step_gflop", value=round(flops / 1e9, 2), **common)
    emit(figure="step_gflop_unshared", value=round(unshared / 1e9, 2), **common)
    emit(figure="achieved_gflops", value=round(flops / step_s / 1e9, 2), **common)
    if rates:  # the step's FLOPs at the matmul rate of their dtype (sampling: rollout, the rest: compute)
        from experiments.bench_phases import matmul_rate

        at_peak_s = (
            fwd / matmul_rate(rates, rollout_dtype) + 4 * fwd / matmul_rate(rates, compute_dtype)
        ) / 1e9
        emit(figure="fraction_of_matmul_peak", value=round(at_peak_s / step_s, 3), **common)
    mem = memory_metrics()  # accelerators: also the device allocator's peak (CPU: none)
    emit(figure="peak_rss_mb", value=round(mem["memory/host_peak_rss_mb"], 1), **common)
    if "memory/device_peak_mb" in mem:
        emit(figure="device_peak_mb", value=round(mem["memory/device_peak_mb"], 1), **common)
    if rates:  # after the peak: the decode step beside its floor, the prefill timed as the sampler runs it
        from experiments.bench_phases import decode_floor_s, median_time, sampler_prefill

        prefill_s = median_time(
            sampler_prefill(cfg, rollout_dtype, G, T), state.params, prompt, pmask, reps=5
        )
        decode_s = (statistics.median(samp) - prefill_s) / T  # every row decodes T tokens (no EOS here)
        floor_s = decode_floor_s(cfg, B, G, P, T, rollout_dtype, rates)
        emit(figure="prefill_s", value=round(prefill_s, 4), **common)
        emit(figure="decode_per_token_s", value=round(decode_s, 5), floor_s=round(floor_s, 5), **common)
        emit(figure="decode_fraction_of_floor", value=round(floor_s / decode_s, 3), **common)


def bench_pool(peak: float | None, k: int = 16):
    import jax

    from experiments.pool_timing import measure

    common = dict(size="pool", K=k, backend=jax.default_backend())
    for r in measure(k):
        kind = "" if r["members"] == "full" else "lora_"
        for part in ("logp", "sample"):
            emit(
                figure=f"pool_k{k}_{kind}{part}_ratio",
                value=r[f"{part}_ratio"],
                vmapped_s=r[f"{part}_vmap_s"],
                loop_s=r[f"{part}_loop_s"],
                members=r["members"],
                **common,
            )
        if not kind:
            for part in ("logp", "sample"):
                emit(
                    figure=f"pool_k{k}_one_model_kb_rows_{part}_ratio",
                    value=r[f"one_model_kb_rows_{part}_ratio"],
                    **common,
                )
            emit(figure=f"pool_k{k}_loop_gflops", value=r["loop_gflops"], **common)
            if peak:
                frac = round(r["loop_gflops"] / peak, 3)
                emit(figure=f"pool_k{k}_loop_fraction_of_matmul_peak", value=frac, **common)


def bench_real_lengths(rates):
    """smollm2_varlen / smollm2_eval / multiturn (experiments.bench_varlen)."""
    from experiments import bench_varlen

    engine = FLAGS.rollout_engine or "static"
    kw = dict(slots=FLAGS.engine_slots, chunk=FLAGS.engine_chunk)
    packing = dict(pack_tokens=FLAGS.pack_tokens, per_doubling=FLAGS.pack_rows_per_doubling)
    if FLAGS.size == "smollm2_varlen":
        dtypes = (FLAGS.compute_dtype, FLAGS.rollout_dtype)
        bench_varlen.bench_varlen(FLAGS.steps, emit, engine_kind=engine, dtypes=dtypes, **packing, **kw)
    elif FLAGS.size == "multiturn":
        bench_varlen.bench_multiturn(FLAGS.steps, emit, engine_kind=engine, **packing, **kw)
    elif FLAGS.rollout_engine is None:  # smollm2_eval: both engines, one process each (peak RSS apart)
        for kind in ("static", "continuous"):
            args = [
                sys.executable,
                "-m",
                "experiments.bench",
                "--size=smollm2_eval",
                f"--rollout_engine={kind}",
            ]
            args += [f"--steps={FLAGS.steps}", f"--engine_slots={FLAGS.engine_slots}", "--nomatmul"]
            args += [f"--engine_chunk={FLAGS.engine_chunk}", f"--compilation_cache={FLAGS.compilation_cache}"]
            subprocess.run(args, check=True, env=dict(os.environ, GRPO_BENCH_RATES=json.dumps(rates or {})))
    else:
        bench_varlen.bench_eval(FLAGS.steps, emit, engine_kind=engine, **kw)


def main(argv):
    del argv
    from grpo_jax.runtime import compile_cache

    cache_dir = compile_cache.enable(FLAGS.compilation_cache)  # before the first compilation
    if FLAGS.cpu_devices and FLAGS.size not in ("tiny", "small", "smollm2_random"):
        raise app.UsageError(
            f"--cpu_devices applies to --size=tiny, small or smollm2_random, not --size={FLAGS.size}"
        )
    if FLAGS.cpu_devices > 1 and FLAGS.prompts % FLAGS.cpu_devices:
        raise app.UsageError(
            f"--prompts={FLAGS.prompts} must be divisible by --cpu_devices={FLAGS.cpu_devices}"
        )
    from grpo_jax.runtime import sharding

    sharding.set_cpu_devices(FLAGS.cpu_devices)  # before anything touches a device
    rates = None
    if FLAGS.matmul:
        import jax

        from experiments.bench_phases import device_rates_subprocess

        backend = jax.default_backend()
        rates = device_rates_subprocess()  # in a child: the probe arrays stay out of this peak RSS
        emit(figure="matmul_gflops", value=round(rates["matmul_gflops"], 1), backend=backend)
        emit(figure="matmul_bf16_gflops", value=round(rates["matmul_bf16_gflops"], 1), backend=backend)
        emit(figure="bandwidth_gbs", value=round(rates["bandwidth_gbs"], 1), backend=backend)
    sizes = ["tiny", "small", "smollm2", "pool"] if FLAGS.size == "all" else [FLAGS.size]
    if FLAGS.size == "all":
        for s in sizes:  # one process per size so peak RSS is that size's
            args = [sys.executable, "-m", "experiments.bench", f"--size={s}", f"--steps={FLAGS.steps}"]
            args += [
                f"--prompts={FLAGS.prompts}",
                f"--group={FLAGS.group}",
                f"--prompt_len={FLAGS.prompt_len}",
            ]
            args += [f"--new_tokens={FLAGS.new_tokens}", "--nomatmul"]
            args += [f"--compilation_cache={FLAGS.compilation_cache}"]
            args += [f"--remat={FLAGS.remat}"] if FLAGS.remat else []
            args += [f"--compute_dtype={FLAGS.compute_dtype}", f"--rollout_dtype={FLAGS.rollout_dtype}"]
            env = dict(os.environ, GRPO_BENCH_RATES=json.dumps(rates or {}))
            subprocess.run(args, check=True, env=env)
        return
    if rates is None and os.environ.get("GRPO_BENCH_RATES"):
        rates = json.loads(os.environ["GRPO_BENCH_RATES"]) or None
    peak = rates["matmul_gflops"] if rates else None
    emit(figure="compilation_cache", value=cache_dir or "off")
    if FLAGS.size == "pool":
        bench_pool(peak)
        return
    if FLAGS.size in ("smollm2_varlen", "smollm2_eval", "multiturn"):
        bench_real_lengths(rates)
        return
    if FLAGS.size == "smollm2":
        from experiments.bench_phases import bench_peer, device_rates_subprocess

        if rates is None:  # the floors need the device's rates
            rates = device_rates_subprocess()
        bench_peer(
            FLAGS.steps,
            rates,
            emit,
            compute_dtype=FLAGS.compute_dtype,
            rollout_dtype=FLAGS.rollout_dtype,
            logp_chunk=FLAGS.logp_chunk,
            remat=FLAGS.remat,
        )
        return
    from grpo_jax.config import ModelConfig

    remat = FLAGS.remat or ModelConfig().remat
    bench_size(
        FLAGS.size,
        FLAGS.steps,
        FLAGS.prompts,
        FLAGS.group,
        FLAGS.prompt_len,
        FLAGS.new_tokens,
        rates,
        remat,
        compute_dtype=FLAGS.compute_dtype,
        rollout_dtype=FLAGS.rollout_dtype,
        engine_kind=FLAGS.rollout_engine or "static",
        pack_tokens=FLAGS.pack_tokens,
    )


if __name__ == "__main__":
    app.run(main)
