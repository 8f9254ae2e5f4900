"""Supervised warm start (SFT): teacher-forced cross-entropy on completion tokens only.

    L(θ) = − Σ_{b,t} m_{b,t} log π_θ(c_{b,t} | prompt_b, c_{b,<t}) / max(Σ_{b,t} m_{b,t}, 1)

(token mean over the batch; prompt tokens carry no loss). The forward is the GRPO trainer's shared-prompt
forward (`transformer.forward_grouped`) with a group of one, so SFT and GRPO see exactly the same model.

`sft_train` draws shuffled minibatches with jax.random (the permutation of epoch e is keyed by
grpo_jax.rng.derive(key, e, "shuffle")), so the same key gives the same parameters bit for bit. With
`bucket=N` each minibatch is cut to its longest prompt and its longest target, each rounded up to a multiple
of N tokens (only padding is cut: left of the left-padded prompts, right of the right-padded targets), so a
step costs its real lengths instead of prompt_len + max_new_tokens; one compiled step per width pair met. The
loss is the same function of the same tokens (float rounding aside: other shapes, other reduction orders).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import rng as rng_lib
from grpo_jax.policies import transformer as tfm


@flax.struct.dataclass
class SFTBatch:
    prompt: jax.Array  # [B, P] int32, left-padded
    prompt_mask: jax.Array  # [B, P] int32
    completion: jax.Array  # [B, T] int32: reference body + EOS, right-padded
    completion_mask: jax.Array  # [B, T] 1 on body tokens and EOS


def sft_loss(params: Any, cfg: tfm.TransformerConfig, batch: SFTBatch) -> tuple[jax.Array, dict]:
    """(token-mean cross-entropy over masked completion tokens, {"accuracy": greedy token accuracy})."""
    comp = batch.completion[:, None, :]  # [B, 1, T]
    logits, _ = tfm.forward_grouped(params, cfg, batch.prompt, batch.prompt_mask, comp)  # [B, 1, T, V]
    logits = logits[:, 0]
    mask = batch.completion_mask.astype(jnp.float32)
    lsm = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(lsm, batch.completion[..., None], axis=-1)[..., 0]  # [B, T]
    denom = jnp.maximum(mask.sum(), 1.0)
    loss = jnp.sum(nll * mask) / denom
    acc = jnp.sum((jnp.argmax(logits, -1) == batch.completion) * mask) / denom
    return loss, {"accuracy": acc}


@functools.partial(jax.jit, static_argnums=(2, 3))
def _gather(arrays: tuple[jax.Array, ...], idx: jax.Array, prompt_w: int = 0, comp_w: int = 0) -> SFTBatch:
    """The minibatch of rows idx; with widths > 0, its prompts' last prompt_w columns and its targets' first
    comp_w (bucket: only padding is cut)."""
    prompt, pmask, comp, cmask = (a[idx] for a in arrays)
    if prompt_w:
        prompt, pmask = prompt[:, -prompt_w:], pmask[:, -prompt_w:]
    if comp_w:
        comp, cmask = comp[:, :comp_w], cmask[:, :comp_w]
    return SFTBatch(prompt, pmask, comp, cmask)


def bucket_widths(pmask: np.ndarray, cmask: np.ndarray, rows: np.ndarray, bucket: int) -> tuple[int, int]:
    """(prompt width, target width) of a bucketed minibatch: its longest prompt and target over rows, rounded
    up to a multiple of `bucket`, at most the full widths."""
    up = lambda n, full: min(full, -(-max(int(n), 1) // bucket) * bucket)  # noqa: E731
    return up(pmask[rows].sum(1).max(), pmask.shape[1]), up(cmask[rows].sum(1).max(), cmask.shape[1])


@functools.lru_cache(maxsize=16)
def make_sft_step(model_cfg: tfm.TransformerConfig, optimizer: optax.GradientTransformation):
    """A jitted `step(params, opt_state, batch) -> (params, opt_state, metrics)` (params/opt_state donated).

    metrics: {"loss", "accuracy", "grad_norm", "tokens"} as float32 scalars. Cached per (config, optimizer
    object), so repeated `sft_train` calls with the same optimizer compile once."""

    def step(params, opt_state, batch: SFTBatch):
        (loss, aux), grads = jax.value_and_grad(sft_loss, has_aux=True)(params, model_cfg, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {
            "loss": loss,
            "accuracy": aux["accuracy"],
            "grad_norm": optax.tree.norm(grads),
            "tokens": jnp.sum(batch.completion_mask).astype(jnp.float32),
        }
        return params, opt_state, metrics

    return jax.jit(step, donate_argnums=(0, 1))


def sft_train(
    params: Any,
    model_cfg: tfm.TransformerConfig,
    optimizer: optax.GradientTransformation,
    data: tuple[Any, Any, Any, Any],
    *,
    steps: int,
    batch_size: int,
    key: jax.Array,
    log_every: int = 0,
    print_fn: Callable[[str], None] = print,
    bucket: int = 0,
) -> tuple[Any, list[dict[str, float]]]:
    """Train `steps` minibatch updates on `data` = (prompt, prompt_mask, completion, completion_mask)
    (arrays with a leading example axis, e.g. from `grpo_jax.codegen.pipeline.sft_examples`).

    Minibatches walk a fresh jax.random permutation each epoch (keyed by rng.derive(key, epoch, "shuffle"));
    a batch_size larger than the data is clipped to the data size. `bucket` > 0: each minibatch cut to its
    real lengths rounded up to multiples of it (the module docstring).
    Returns (params, per-step metrics as floats)."""
    n = int(data[0].shape[0])
    if n == 0:
        raise ValueError("sft_train: no examples")
    if steps < 0 or batch_size < 1 or bucket < 0:
        raise ValueError(
            f"sft_train: steps={steps}, bucket={bucket} must be >= 0 and batch_size={batch_size} >= 1"
        )
    bs = min(batch_size, n)
    per_epoch = n // bs
    arrays = tuple(jnp.asarray(a) for a in data)
    masks = (np.asarray(data[1]), np.asarray(data[3])) if bucket else None  # host copies: the widths
    step_fn = make_sft_step(model_cfg, optimizer)
    opt_state = optimizer.init(params)
    params = jax.tree.map(jnp.copy, params)  # the caller's params are not donated

    raw: list[dict[str, jax.Array]] = []
    perm: jax.Array | None = None
    t0 = time.perf_counter()
    for i in range(steps):
        epoch, j = divmod(i, per_epoch)
        if j == 0:
            perm = jax.random.permutation(rng_lib.derive(key, epoch, "shuffle"), n)
        assert perm is not None  # drawn at each epoch's first step, i = 0 included
        rows = perm[j * bs : (j + 1) * bs]
        widths = bucket_widths(*masks, np.asarray(rows), bucket) if masks is not None else (0, 0)
        batch = _gather(arrays, rows, *widths)
        params, opt_state, metrics = step_fn(params, opt_state, batch)
        raw.append(metrics)
        if log_every and ((i + 1) % log_every == 0 or i == steps - 1):
            m = {k: float(v) for k, v in metrics.items()}
            print_fn(
                f"sft step {i + 1:5d}/{steps}  loss {m['loss']:.4f}  acc {m['accuracy']:.3f}"
                f"  grad_norm {m['grad_norm']:.3f}  {time.perf_counter() - t0:6.1f}s"
            )
    history = [{k: float(v) for k, v in m.items()} for m in jax.device_get(raw)]
    return params, history
