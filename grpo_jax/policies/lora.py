"""LoRA adapters for the transformer's projections, as a separate parameter pytree (Hu et al. 2021).

    adapters = init(params, key, rank=8)  # {"layers": {"q_proj": {"lora_a": [L,in,r], "lora_b": [L,r,out]}}}
    logits = forward(merge(params, adapters, alpha=16), ...)  # y = x W + (x A) B * alpha / r
    frozen = merge(jax.lax.stop_gradient(params), adapters)  # train the adapters only

B is initialised to zero, so a fresh adapter leaves the model's outputs unchanged. `merge` attaches the
adapter leaves next to each targeted kernel (`transformer.dense` applies them); `fold` bakes them into the
kernels (W + A B alpha / r) for export or for evaluating a stored snapshot without the extra matmuls.
A pool of past policies can store adapters only: K x `num_params(adapters)` numbers instead of K full models,
and `merge_members` evaluates M of them at once on ONE copy of the base (multi-adapter batching as in
Punica / S-LoRA: the base matmul serves every member's rows; only the rank-r deltas are per member).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def init(params: dict, key: jax.Array, *, rank: int, targets: tuple[str, ...] = TARGETS) -> dict:
    """Adapters for every targeted projection: A ~ U(±1/sqrt(in)) (kaiming-uniform as in the reference
    implementation), B = 0. Shapes follow the stacked layers: A [L, in, r], B [L, r, out]."""
    if rank < 1:
        raise ValueError(f"LoRA rank={rank}: must be >= 1")
    layers = params["layers"]
    unknown = [t for t in targets if t not in layers]
    if unknown:
        raise ValueError(f"LoRA targets {unknown} are not projections of this model; valid: {TARGETS}")
    out = {}
    for i, name in enumerate(targets):
        n, din, dout = layers[name]["kernel"].shape
        bound = 1.0 / math.sqrt(din)
        a = jax.random.uniform(jax.random.fold_in(key, i), (n, din, rank), jnp.float32, -bound, bound)
        out[name] = {"lora_a": a, "lora_b": jnp.zeros((n, rank, dout), jnp.float32)}
    return {"layers": out}


def _scale(adapters: dict, alpha: float) -> float:
    any_a = next(iter(adapters["layers"].values()))["lora_a"]
    return alpha / any_a.shape[-1]


def merge(params: dict, adapters: dict, *, alpha: float = 16.0) -> dict:
    """params with the adapter leaves and a per-layer `lora_scale` = alpha / r beside each targeted kernel."""
    scale = _scale(adapters, alpha)
    layers = dict(params["layers"])
    for name, ad in adapters["layers"].items():
        n = ad["lora_a"].shape[0]
        layers[name] = {**layers[name], **ad, "lora_scale": jnp.full((n,), scale, jnp.float32)}
    return {**params, "layers": layers}


def merge_members(params: dict, members: dict, *, alpha: float = 16.0) -> dict:
    """params with M stacked adapters (members: the `init` layout with a leading member axis, leaves
    [M, L, in, r] / [M, L, r, out]) attached as lora_a [L, M, in, r] / lora_b [L, M, r, out] beside each
    targeted kernel: the base is NOT copied per member.

    The result evaluates M models at once on a batch whose rows are MEMBER-MAJOR: rows [i*N, (i+1)*N) of
    every activation belong to member i (tile the prompts M times: `jnp.tile(prompt, (M, 1))`).
    `transformer.dense` then computes x W for all M*N rows in one matmul and adds member i's
    (x A_i) B_i alpha / r to its rows; row block i equals the model `merge(params, member_i)` on its rows."""
    swapped = {
        name: {k: jnp.swapaxes(v, 0, 1) for k, v in ad.items()} for name, ad in members["layers"].items()
    }
    return merge(params, {"layers": swapped}, alpha=alpha)


def num_members(members: dict) -> int:
    """M of a stacked adapter tree (leading member axis)."""
    return int(next(iter(members["layers"].values()))["lora_a"].shape[0])


def fold(params: dict, adapters: dict, *, alpha: float = 16.0) -> dict:
    """params with W <- W + A B alpha / r and no adapter leaves: the same function as `merge`."""
    scale = _scale(adapters, alpha)
    layers = dict(params["layers"])
    for name, ad in adapters["layers"].items():
        w = layers[name]["kernel"]
        delta = jnp.einsum("lir,lro->lio", ad["lora_a"], ad["lora_b"]) * scale
        layers[name] = {**layers[name], "kernel": (w.astype(jnp.float32) + delta).astype(w.dtype)}
    return {**params, "layers": layers}


def num_params(tree: Any) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(tree))
