"""Device meshes and shardings: the only module that names mesh axes.

Data parallel = the batch's leading axis (B prompts; a group never straddles devices, so group statistics
stay local) sharded over the "data" axis; model parallel = Megatron-style column/row sharding of the
transformer's projection kernels over the "model" axis. Both are expressed as `NamedSharding`s and the train
step is an ordinary `jax.jit` (the modern form of `pmap`): XLA inserts the gradient all-reduce itself.

Meshes are created with `AxisType.Auto` (jax.make_mesh defaults to Explicit axes in this JAX version, under
which sharded contractions raise ShardingTypeError unless every op is annotated).

Not wired into the main job yet: `python -m experiments.codegen` runs on one device (its `--mesh_data` /
`--mesh_model` flags accept only 1 and say so); this module is used by the multi-device equality test
(tests/test_multidevice.py) until the scale-out issue builds the mesh in the loop.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA = "data"
MODEL = "model"

# transformer projection kernels are stored [L, in, out] (stacked layers)
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # shard the output dim
_ROW = ("o_proj", "down_proj")  # shard the input dim


def make_mesh(data: int | None = None, model: int = 1, devices=None) -> Mesh:
    """A (data, model) mesh over `devices` (default: all). data=None uses every device not used by model."""
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if model < 1 or n % model:
        raise ValueError(f"make_mesh: model={model} must be >= 1 and divide the device count {n}")
    data = n // model if data is None else data
    if data * model != n:
        raise ValueError(f"make_mesh: data*model = {data}*{model} must equal the device count {n}")
    return jax.make_mesh(
        (data, model), (DATA, MODEL), axis_types=(AxisType.Auto, AxisType.Auto), devices=devices
    )


def _names(path) -> list[str]:
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out.append(k.name)
    return out


def param_spec(path, leaf, model_parallel: bool) -> P:
    """PartitionSpec of one parameter-shaped leaf (params, reference params, Adam moments alike)."""
    if not model_parallel or not hasattr(leaf, "ndim"):
        return P()
    names = _names(path)
    owner = next((n for n in reversed(names) if n in _COLUMN or n in _ROW), None)
    if owner is None:
        return P()
    last = names[-1] if names else ""
    if last == "kernel" and leaf.ndim == 3:
        return P(None, None, MODEL) if owner in _COLUMN else P(None, MODEL, None)
    if last == "bias" and leaf.ndim == 2 and owner in _COLUMN:
        return P(None, MODEL)
    return P()


def state_shardings(state: Any, mesh: Mesh, *, model_parallel: bool = False):
    """NamedShardings for a whole TrainState (params, optimizer moments, reference, controllers, rng)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, param_spec(path, leaf, model_parallel)), state
    )


def batch_shardings(batch: Any, mesh: Mesh):
    """Every batch leaf is sharded along its leading (prompt) axis over "data"."""
    return jax.tree.map(lambda leaf: NamedSharding(mesh, P(DATA)), batch)


def shard(tree: Any, shardings: Any):
    return jax.device_put(tree, shardings)
