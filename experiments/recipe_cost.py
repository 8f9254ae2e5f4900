"""The expected cost of a run's step on a device you describe, from the bench's roofline floors
(experiments.bench_phases): a recipe's lower bound before anyone rents the device.

    python -m experiments.recipe_cost --run_flagfile=experiments/recipes/qwen_coder_0.5b_cold_start.flags \\
        --config=experiments/recipes/qwen2.5-coder-0.5b-instruct.config.json \\
        --matmul_tflops=400 --bandwidth_gbs=2000 [--mean_reply=0.5] [--mean_prompt=0.4]

The model is the config.json given (its shapes; no weights needed); the workload is the flagfile's (prompts
x G per step, prompt and reply limits, the engine's slots, the KL reference, the SFT batch). Replies are
taken to average --mean_reply of --max_new_tokens and prompts --mean_prompt of --prompt_len (MBPP at 512
tokens with SmolLM2: mean reply 265 of 512). Floors, each the larger of FLOPs / the matmul rate and bytes /
the bandwidth:
  - sampling: the continuous engine's decode steps with every slot busy (total reply tokens / rows) x the
    decode step's floor (decode_floor_s: weights + KV cache read, or the FLOPs), plus the prompts' prefill;
  - train step: forward FLOPs F of the packed rows (each prompt once, its G replies after it) x (1 forward
    + 2 backward + 1 rematerialised forward) + F for the reference when β > 0 (the π_old pass is the same
    forward when --num_iterations=1);
  - SFT step: the same 4 F over one SFT batch of prompt + reference (a reference taken as long as a reply).
Real steps run above their floors (on this CPU SmolLM2's decode ran at 0.47-1.04 of its floor and its train
step at 43-46 % of the matmul rate: README "machine matmul rates"); read these as lower bounds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("run_flagfile", None, "The main job's flagfile of the run.")
flags.DEFINE_string("config", None, "A Hugging Face config.json of the model (shapes only).")
flags.DEFINE_float("matmul_tflops", None, "The device's bf16 matmul rate, TFLOP/s (measured or expected).")
flags.DEFINE_float("bandwidth_gbs", None, "The device's memory bandwidth, GB/s.")
flags.DEFINE_float("mean_reply", 0.5, "Mean reply length as a fraction of --max_new_tokens.")
flags.DEFINE_float("mean_prompt", 0.4, "Mean prompt length as a fraction of --prompt_len.")


def floors(cfg, model, rates: dict, mean_reply: float, mean_prompt: float) -> dict[str, float]:
    """Seconds: sampling, train step, SFT step and a GRPO step (sampling + train) at these rates."""
    from experiments.bench_phases import decode_floor_s

    ro, B, G = cfg.rollout, cfg.rollout.prompts_per_step, cfg.rollout.group_size
    T, P = ro.max_new_tokens * mean_reply, cfg.tasks.prompt_len * mean_prompt
    rate = rates["matmul_bf16_gflops"] * 1e9
    rows = min(B * G, ro.engine_slots) if ro.engine == "continuous" else B * G
    steps = B * G * T / rows  # decode steps with every row busy
    decode = steps * decode_floor_s(model, rows, 1, int(P), T, cfg.rollout.rollout_dtype, rates)
    prefill = B * P * model.matmul_flops_per_token(int(P / 2)) / rate
    fwd = B * P * model.matmul_flops_per_token(int(P / 2)) + B * G * T * model.matmul_flops_per_token(
        int(P + T / 2)
    )
    passes = 4 + (1 if cfg.objective.uses_reference else 0)
    sft_fwd = cfg.sft.batch * (P + T) * model.matmul_flops_per_token(int((P + T) / 2))
    out = {"sampling_s": decode + prefill, "train_s": passes * fwd / rate, "sft_step_s": 4 * sft_fwd / rate}
    out["grpo_step_s"] = out["sampling_s"] + out["train_s"]
    return out


def report(
    flagfile: str, config: str, tflops: float, gbs: float, mean_reply: float, mean_prompt: float
) -> str:
    """The printed floors of the run of `flagfile` with the model of `config` on a device of these rates."""
    from grpo_jax import cli
    from grpo_jax.pretrained.hf import config_from_hf

    with open(config, encoding="utf-8") as f:
        hf = json.load(f)
    model = config_from_hf(hf)
    with tempfile.TemporaryDirectory() as d:  # a checkpoint directory of shapes only, for the flags' checks
        shutil.copy(config, os.path.join(d, "config.json"))
        cfg, _ = cli.resolve(["codegen", f"--flagfile={flagfile}", f"--init_from={d}"])
    rates = {"matmul_gflops": tflops * 1e3, "matmul_bf16_gflops": tflops * 1e3, "bandwidth_gbs": gbs}
    got = floors(cfg, model, rates, mean_reply, mean_prompt)
    ro = cfg.rollout
    lines = [
        f"{hf.get('model_type')} {model.num_params() / 1e6:.0f} M parameters; {ro.prompts_per_step} prompts "
        f"x G = {ro.group_size}, replies {mean_reply:.2f} x {ro.max_new_tokens}, prompts {mean_prompt:.2f} x "
        f"{cfg.tasks.prompt_len} tokens; {tflops:g} TFLOP/s, {gbs:g} GB/s"
    ]
    lines += [f"  {k:<12} >= {v:8.3f} s" for k, v in got.items()]
    total = cfg.steps * got["grpo_step_s"] + cfg.sft.steps * got["sft_step_s"]
    lines.append(
        f"  run ({cfg.sft.steps} SFT + {cfg.steps} GRPO steps, evaluations excluded) >= {total / 60:.1f} min"
    )
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    for name in ("run_flagfile", "config", "matmul_tflops", "bandwidth_gbs"):
        if getattr(FLAGS, name) is None:
            raise app.UsageError(f"--{name} is required")
    print(
        report(
            FLAGS.run_flagfile,
            FLAGS.config,
            FLAGS.matmul_tflops,
            FLAGS.bandwidth_gbs,
            FLAGS.mean_reply,
            FLAGS.mean_prompt,
        )
    )


if __name__ == "__main__":
    app.run(main)
