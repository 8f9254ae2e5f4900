"""Workloads at real reply lengths for `experiments.bench` (issue 42): what the rollout engine and the packed
update buy where replies spread widely. Every figure is one JSON line naming its engine and packing.

    python -m experiments.bench --size=smollm2_varlen --rollout_engine=static --pack_tokens=0
    python -m experiments.bench --size=smollm2_varlen --rollout_engine=continuous --pack_tokens=512 \\
        --pack_rows_per_doubling=8
    python -m experiments.bench --size=smollm2_eval            # both engines, one process each
    python -m experiments.bench --size=multiturn --rollout_engine=static --pack_tokens=24
    python -m experiments.bench --size=multiturn --rollout_engine=continuous --pack_tokens=24

(--pack_tokens must hold the longest completion: 512 for smollm2_varlen; the multiturn arms use at least their
completion length, 24 and 176. Measured figures: docs/ROLLOUT_ENGINES.md.)

smollm2_varlen: a GRPO step of SmolLM2-135M-Instruct on MBPP's training prompts in its chat template (step i
takes prompts 4i .. 4i + 3), 4 prompts x G = 8, up to 512 new tokens at temperature 1 ending at its
end-of-generation ids, beta 0.04 (k3, a frozen reference), AdamW lr 1e-6, the chunked head (512). The reward
is computed on the host from the decoded text (1 when the reply holds a `def`: cheap and non-constant; the
sandbox is not what is compared). Figures: step_s_median (sample + reward + train step), sampling_s_median,
train_step_s_median, last10_wait_s_median (the sampling seconds after 90 % of the samples had ended),
padding_fraction_sampler (1 - reply tokens / row-steps decoded), padding_fraction_update
(1 - real tokens / positions computed: the padded update's B*P + B*G*T, the packed one's B*P + R*N),
useful_tokens_per_s (reply tokens, EOS included, per second of step), reply_tokens_mean, truncated_fraction,
peak_rss_mb.

smollm2_eval: an evaluation stream, SmolLM2 on the first 16 MBPP test prompts x 8 samples at 512 new tokens
and temperature 1 (the 128 samples `experiments.evaluate --init_from=smollm2 --problems=mbpp --limit=16
--num_samples=8` draws), through grpo_jax.eval's own batches and sampler for each engine (the static engine
in evaluate's batches of prompts bucketed by length; the continuous engine one queue per `--eval_batch`
prompts). The pass is run twice and the second timed (the first compiles). Figures: useful_tokens_per_s
(reply tokens as they end, EOS included, per second of sampling), wall_s, and the engine's counts.

multiturn: the quickstart model (experiments/flagfiles/quickstart.flags, its SFT warm start once), then GRPO
steps single-turn (16 prompts x 8) and 2-turn (8 prompts x 8, --max_turns=2: at most the same sampled
tokens), each arm with the engine and packing given; figure two_turn_over_single_turn = the 2-turn median
step time / the single-turn one, with each arm's phases (rollout, train step) beside it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time

MBPP_PROMPTS = 4
GROUP = 8
MAX_NEW = 512


def _peak_rss_mb() -> float:
    from grpo_jax.runtime.memory import memory_metrics

    return round(memory_metrics()["memory/host_peak_rss_mb"], 1)


def _smollm2(compute_dtype: str, logp_chunk: int = 512):
    import jax

    from grpo_jax.pretrained.api import load_pretrained, load_tokenizer

    cfg, params = load_pretrained("smollm2-135m-instruct")
    cfg = dataclasses.replace(cfg, compute_dtype=compute_dtype, logp_chunk=logp_chunk)
    return cfg, jax.device_put(params), load_tokenizer("smollm2-135m-instruct")


def mbpp_batches(tok, split: str, n: int, per: int):
    """[(prompt [per, P], mask)] of the first n MBPP `split` problems in the chat template, P the longest."""
    from grpo_jax.codegen import datasets, pipeline

    probs = datasets.load_mbpp(split=split)[:n]
    fmt = pipeline.PromptFormat("chat")
    width = max(len(tok.encode(pipeline.render_prompt(tok, p, fmt))) for p in probs)
    width = -(-width // 64) * 64
    ids, mask = pipeline.encode_prompts(tok, probs, width, fmt)
    return [(ids[i : i + per], mask[i : i + per]) for i in range(0, n, per)], probs


def bench_varlen(
    steps: int, emit, *, engine_kind: str, pack_tokens: int, slots: int, chunk: int, dtypes, per_doubling=2
):
    """The smollm2_varlen workload (see the module docstring)."""
    import jax
    import numpy as np

    from grpo_jax.config import ObjectiveConfig, OptimConfig
    from grpo_jax.policies import sampling
    from grpo_jax.rollout.engines import make_engine
    from grpo_jax.tokenization.batch import decode_completions, stop_ids
    from grpo_jax.train.state import init_state, make_optimizer
    from grpo_jax.train.step import make_train_step
    from grpo_jax.types import batch_from_samples

    compute_dtype, rollout_dtype = dtypes
    cfg, params, tok = _smollm2(compute_dtype)
    batches, _ = mbpp_batches(tok, "train", MBPP_PROMPTS * (steps + 1), MBPP_PROMPTS)
    obj = ObjectiveConfig(kl_coef=0.04)
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-6, grad_clip=1.0))
    state = init_state(params, obj, optimizer, seed=0)
    del params
    train_step = make_train_step(
        cfg, obj, optimizer, temperature=1.0, pack_tokens=pack_tokens, pad_id=tok.pad_id,
        pack_rows_per_doubling=per_doubling,
    )  # fmt: skip
    engine = make_engine(
        engine_kind, cfg, max_new=MAX_NEW, eos_ids=stop_ids(tok), pad_id=tok.pad_id,
        weights_dtype=rollout_dtype, slots=slots, chunk=chunk,
    )  # fmt: skip
    sp = sampling.sampling_params(1.0)
    rows = []
    for i, (prompt, pmask) in enumerate(batches):
        t0 = time.perf_counter()
        out = engine.generate(state.params, prompt, pmask, jax.random.PRNGKey(100 + i), n=GROUP, sp=sp)
        tokens, mask = jax.device_get((out.tokens, out.mask))
        t1 = time.perf_counter()
        texts = decode_completions(tok, np.asarray(tokens), np.asarray(mask))
        rewards = np.asarray([1.0 if "def " in t else 0.0 for t in texts], np.float32).reshape(-1, GROUP)
        batch = batch_from_samples(prompt, pmask, out, rewards)
        t2 = time.perf_counter()
        state, metrics, _ = train_step(state, batch)
        jax.block_until_ready(metrics)
        t3 = time.perf_counter()
        m = np.asarray(mask)
        real = int(pmask.sum()) + int(np.asarray(_packed_lengths(m)).sum())
        update_pad = (
            float(metrics["pack/padding_fraction"]) if pack_tokens else 1.0 - real / (pmask.size + m.size)
        )
        st = engine.last_stats
        row = dict(step=t3 - t0, sampling=t1 - t0, train=t3 - t2, useful=float(m.sum()))
        row["trunc"] = float(np.mean(out.truncated))
        row["pad_sampler"] = 1.0 - st["useful_tokens"] / max(st["row_steps"], 1.0)
        row["pad_update"] = update_pad
        if pack_tokens:
            row["rows"], row["rows_needed"] = float(metrics["pack/rows"]), float(metrics["pack/rows_needed"])
        row["last10"] = _last10_s(st, np.asarray(out.lengths), t1 - t0)
        rows.append(row)
        emit(
            figure="step_s",
            value=round(t3 - t0, 2),
            step=i,
            first=i == 0,
            engine=engine_kind,
            pack_tokens=pack_tokens,
        )
    timed = rows[1:] or rows
    common = dict(size="smollm2_varlen", engine=engine_kind, pack_tokens=pack_tokens, B=MBPP_PROMPTS, G=GROUP)
    if pack_tokens:
        common.update(pack_rows_per_doubling=per_doubling)
    common.update(T=MAX_NEW, steps=len(timed), compute_dtype=compute_dtype, rollout_dtype=rollout_dtype)
    if engine_kind == "continuous":
        common.update(engine_slots=slots, engine_chunk=chunk)
    med = lambda k: statistics.median(r[k] for r in timed)  # noqa: E731
    emit(figure="step_s_median", value=round(med("step"), 2), **common)
    emit(figure="sampling_s_median", value=round(med("sampling"), 2), **common)
    emit(figure="train_step_s_median", value=round(med("train"), 2), **common)
    emit(figure="padding_fraction_sampler", value=round(med("pad_sampler"), 3), **common)
    emit(figure="padding_fraction_update", value=round(med("pad_update"), 3), **common)
    emit(figure="last10_wait_s_median", value=round(med("last10"), 2), **common)
    if pack_tokens:
        emit(figure="packed_rows", value=[r["rows"] for r in timed], **common)
        emit(figure="packed_rows_needed", value=[r["rows_needed"] for r in timed], **common)
    useful = sum(r["useful"] for r in timed) / sum(r["step"] for r in timed)
    emit(figure="useful_tokens_per_s", value=round(useful, 1), **common)
    emit(
        figure="reply_tokens_mean",
        value=round(statistics.mean(r["useful"] for r in timed) / (MBPP_PROMPTS * GROUP), 1),
        **common,
    )
    emit(figure="truncated_fraction", value=round(statistics.mean(r["trunc"] for r in timed), 3), **common)
    emit(figure="peak_rss_mb", value=_peak_rss_mb(), **common)


def _last10_s(stats: dict, lengths, sampling_s: float) -> float:
    """Seconds of sampling spent after 90 % of the samples had ended: the wait of a synchronous step for its
    slowest tenth. The continuous engine times it (its chunks run once 90 % were done); a static batch decodes
    every step alike, so its share of the steps past the 90th-percentile length is taken."""
    if "last10_s" in stats:
        return float(stats["last10_s"])
    longest = float(lengths.max(initial=0))
    if longest <= 0:
        return 0.0
    p90 = float(sorted(lengths.ravel())[int(0.9 * (lengths.size - 1))])
    return sampling_s * (longest - p90) / longest


def _packed_lengths(mask):
    from grpo_jax.policies.packed import completion_lengths

    return completion_lengths(mask)


def bench_eval(passes: int, emit, *, engine_kind: str, slots: int, chunk: int, batch: int = 16):
    """The smollm2_eval workload (see the module docstring) for one engine."""
    import jax
    import numpy as np

    from grpo_jax.codegen import pipeline
    from grpo_jax.eval import evaluation
    from grpo_jax.policies import sampling
    from grpo_jax.rollout.engines import make_engine
    from grpo_jax.tokenization.batch import stop_ids

    cfg, params, tok = _smollm2("float32")
    from grpo_jax.codegen import datasets

    probs = datasets.load_mbpp(split="test")[:16]
    engine = make_engine(
        engine_kind, cfg, max_new=MAX_NEW, eos_ids=stop_ids(tok), pad_id=tok.pad_id,
        weights_dtype=sampling.policy_weights_dtype(cfg), slots=slots, chunk=chunk,
    )  # fmt: skip
    prompt_len = 64  # the main job's default --prompt_len: experiments.evaluate's batch token budget
    spec = evaluation.EvalSpec(
        n_samples=8, ks=(1, 8), batch=batch, max_new_tokens=MAX_NEW,
        max_batch_tokens=evaluation.batch_tokens(engine, batch, prompt_len),
    )  # fmt: skip
    policy = evaluation.Policy(params, tok, pipeline.PromptFormat("chat"), jax.device_get)
    plan = evaluation.plan(policy, probs, spec)
    common = dict(size="smollm2_eval", engine=engine_kind, samples=128, T=MAX_NEW, batches=len(plan))
    if engine_kind == "continuous":
        common.update(engine_slots=slots, engine_chunk=chunk)
    for p in range(passes + 1):
        fn = evaluation.sample_fn(policy, engine, jax.random.PRNGKey(7), spec)
        t0, useful, row_steps = time.perf_counter(), 0.0, 0.0
        for ids, plen, rows in plan:
            chunk_probs = [probs[i] for i in ids] + [probs[ids[-1]]] * (rows - len(ids))
            prompt, pmask = pipeline.encode_prompts(tok, chunk_probs, plen, policy.fmt)
            _, mask = fn(prompt, pmask, 8, False)
            useful += float(np.asarray(mask)[: len(ids)].sum())
            row_steps += engine.last_stats["row_steps"]
        wall = time.perf_counter() - t0
        if p == 0 and passes:
            emit(figure="first_pass_s", value=round(wall, 1), **common)
            continue
        emit(figure="useful_tokens_per_s", value=round(useful / wall, 1), pass_=p, **common)
        emit(figure="wall_s", value=round(wall, 1), pass_=p, **common)
        emit(
            figure="padding_fraction_sampler",
            value=round(1.0 - useful / max(row_steps, 1.0), 3),
            pass_=p,
            **common,
        )
    emit(figure="peak_rss_mb", value=_peak_rss_mb(), **common)


def bench_multiturn(
    steps: int, emit, *, engine_kind: str, pack_tokens: int, slots: int, chunk: int, per_doubling: int = 2
):
    """The multiturn workload (see the module docstring)."""
    from grpo_jax import cli
    from grpo_jax.sandbox.executor import Executor
    from grpo_jax.sandbox.types import Limits
    from grpo_jax.train import loop

    root = tempfile.mkdtemp(prefix="bench_multiturn_")
    base = ["codegen", "--flagfile=experiments/flagfiles/quickstart.flags", "--eval_samples=0", "--eval_ks="]
    base += ["--checkpoint_every=0", "--sample_log_every=0", f"--rollout_engine={engine_kind}"]
    base += [f"--engine_slots={slots}", f"--engine_chunk={chunk}"]
    arms = {"single_turn": [], "two_turn": ["--max_turns=2", "--prompts_per_step=8"]}
    common = dict(size="multiturn", engine=engine_kind, pack_tokens=pack_tokens, steps=steps)
    if pack_tokens:
        common.update(pack_rows_per_doubling=per_doubling)
    medians = {}
    with Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2)) as ex:
        warm, _ = cli.resolve([*base, "--steps=0", f"--workdir={os.path.join(root, 'warm')}"])
        loop.run(warm, ex, print_fn=lambda _: None)
        for arm, flags in arms.items():
            width = 24 if arm == "single_turn" else (2 * 24 + 128)  # the arm's completion length
            pack = []
            if pack_tokens:
                pack = [f"--pack_tokens={max(pack_tokens, width)}"]
                pack += [f"--pack_rows_per_doubling={per_doubling}"]
            argv = [*base, *flags, *pack, f"--steps={steps + 1}", f"--sft_from={os.path.join(root, 'warm')}"]
            cfg, notes = cli.resolve([*argv, f"--workdir={os.path.join(root, arm)}"])
            loop.run(cfg, ex, print_fn=lambda _: None, notes=notes)
            rows = [json.loads(x) for x in open(os.path.join(root, arm, "metrics.jsonl"))]
            rows = [r for r in rows if "time/step_s" in r][1:]  # the first step compiles
            med = lambda k, rows=rows: statistics.median(r[k] for r in rows)  # noqa: E731
            medians[arm] = med("time/step_s")
            emit(figure=f"{arm}_step_s_median", value=round(medians[arm], 3), **common)
            for k in ("time/rollout_s", "time/train_s", "time/sample_s", "time/reward_s"):
                emit(figure=f"{arm}_{k.split('/')[1]}_median", value=round(med(k), 3), **common)
            tokens = statistics.mean(r["rollout/sampled_tokens"] for r in rows)
            emit(figure=f"{arm}_sampled_tokens_mean", value=round(tokens, 1), **common)
            if pack_tokens:
                emit(figure=f"{arm}_packed_rows", value=[r["pack/rows"] for r in rows], **common)
                emit(
                    figure=f"{arm}_update_padding_fraction",
                    value=round(med("pack/padding_fraction"), 3),
                    **common,
                )
    ratio = medians["two_turn"] / medians["single_turn"]
    emit(figure="two_turn_over_single_turn", value=round(ratio, 2), **common)
