"""Per-reward figures of a step (numpy): each reward's mean and std over the batch's samples and its share
of the advantage.

The share: the advantage is a sum of one component per reward,
    sum_then_normalize:  c_{i,k} = w_k (r_{i,k} − mean_G r_{·,k}) / (std_G r + eps)     (r = Σ_k w_k r_k)
    normalize_then_sum:  c_{i,k} = w_k r̃_{i,k} / (std_batch r + eps)                 (r = Σ_k w_k r̃_k)
with r̃_{i,k} = (r_{i,k} − mean_G r_{·,k}) / (std_G r_{·,k} + eps), and
    share_k = Σ_i |c_{i,k}| / Σ_j Σ_i |c_{i,j}|      (0 when no reward moves any advantage).
Stds are Bessel-corrected, as the advantages' (TRL's).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _std(x: np.ndarray, axis) -> np.ndarray:
    n = np.prod([x.shape[a] for a in (axis if isinstance(axis, tuple) else (axis,))])
    return (
        np.std(x, axis=axis, keepdims=True, ddof=1)
        if n > 1
        else np.zeros_like(np.mean(x, axis, keepdims=True))
    )


def reward_metrics(
    parts: np.ndarray, weights: np.ndarray, names: Sequence[str], aggregation: str, eps: float = 1e-4
) -> dict[str, float]:
    """{"reward/<name>/mean", "reward/<name>/std", "reward/<name>/adv_share"} of parts [B, G, F]."""
    r = np.asarray(parts, np.float64)
    w = np.asarray(weights, np.float64)
    centred = r - r.mean(axis=1, keepdims=True)  # [B, G, F]
    if aggregation == "sum_then_normalize":
        total = (r * w).sum(-1)  # [B, G]
        comp = w * centred / (_std(total, 1)[..., None] + eps)
    else:
        rk = centred / (_std(r, 1) + eps)
        total = (rk * w).sum(-1)
        comp = w * rk / (_std(total, (0, 1))[..., None] + eps)
    mass = np.abs(comp).sum(axis=(0, 1))  # [F]
    share = mass / mass.sum() if mass.sum() > 0 else np.zeros_like(mass)
    out: dict[str, float] = {}
    flat = r.reshape(-1, r.shape[-1])
    for k, name in enumerate(names):
        key = f"reward/{name.replace(':', '.')}"
        out[f"{key}/mean"] = float(flat[:, k].mean())
        out[f"{key}/std"] = float(flat[:, k].std())
        out[f"{key}/adv_share"] = float(share[k])
    return out
