"""Device meshes and shardings: the only module that names mesh axes.

The mesh has three named axes over every device of every process (jax.devices(), multi-process included):

  data    data parallel: the rollout batch's leading (prompt) axis is split over data x fsdp; a group never
          straddles devices, so group statistics stay local and XLA inserts the gradient all-reduce itself.
  fsdp    parameter sharding (FSDP / ZeRO-3): every parameter-shaped leaf (params, Adam moments, reference,
          LoRA base) is split along its largest dimension that the axis size divides (never the stacked-layer
          axis 0 of `layers`, which the layer scan walks); XLA all-gathers a layer's weights where it is used
          and reduce-scatters its gradient. The batch is split over this axis too.
  tensor  Megatron tensor parallelism: q/k/v/gate/up kernels by output columns, o/down kernels by input rows.

The policy pool's stacked members [K, ...] split K over data and their own dimensions like the parameters
(pool_shardings); the rest of the rollout state is replicated.

Everything is a `NamedSharding` and the train step is an ordinary `jax.jit` (the modern form of `pmap`).
Meshes use `AxisType.Auto` (jax.make_mesh defaults to Explicit axes in this JAX version, under which sharded
contractions raise ShardingTypeError unless every op is annotated).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA = "data"
FSDP = "fsdp"
TENSOR = "tensor"
AXES = (DATA, FSDP, TENSOR)
BATCH_AXES = (DATA, FSDP)  # the batch's leading axis is split over both

# transformer projection kernels are stored [L, in, out] (stacked layers)
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # shard the output dim
_ROW = ("o_proj", "down_proj")  # shard the input dim
_MIN_FSDP_SIZE = 2**12  # leaves smaller than this (norms, biases, scalars) stay replicated


class MeshError(ValueError):
    """The mesh shape does not fit the devices, or the batch does not fit the mesh."""


def mesh_shape(n_devices: int, data: int = -1, fsdp: int = 1, tensor: int = 1) -> tuple[int, int, int]:
    """(data, fsdp, tensor) for n_devices; data=-1 takes every device fsdp x tensor leaves. Raises MeshError
    naming the flags when the product is not the device count."""
    if fsdp < 1 or tensor < 1 or (data != -1 and data < 1):
        raise MeshError(
            f"mesh --mesh_data={data} --mesh_fsdp={fsdp} --mesh_tensor={tensor}: sizes must be >= 1"
        )
    if data == -1:
        if n_devices % (fsdp * tensor):
            raise MeshError(
                f"mesh --mesh_fsdp={fsdp} x --mesh_tensor={tensor} = {fsdp * tensor} does not divide the "
                f"{n_devices} devices of this run (jax.device_count()); valid: divisors of {n_devices}"
            )
        data = n_devices // (fsdp * tensor)
    if data * fsdp * tensor != n_devices:
        raise MeshError(
            f"mesh --mesh_data={data} x --mesh_fsdp={fsdp} x --mesh_tensor={tensor} = {data * fsdp * tensor} "
            f"devices, but this run has {n_devices} (jax.device_count()); the product must equal it "
            "(--mesh_data=-1 takes the rest)"
        )
    return data, fsdp, tensor


def set_cpu_devices(n: int) -> None:
    """Split the CPU backend into `n` devices (jax_num_cpu_devices; 0 = leave JAX's default). XLA:CPU runs one
    program's ops one after another, many of them (small products, reductions, the sampler's per-token work)
    on one thread; n devices each run their shard of a data-parallel step at the same time. Must run before
    JAX touches a device; raises MeshError naming the flag otherwise."""
    if n < 0:
        raise MeshError(f"--mesh_cpu_devices={n}: must be >= 0 (0 = JAX's default)")
    if n == 0:
        return
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as e:
        raise MeshError(
            f"--mesh_cpu_devices={n} must be set before JAX initialises its devices (at the process's "
            f"start): {str(e).splitlines()[0]}"
        ) from None


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: every device of every process)."""
    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_shape(len(devices), data, fsdp, tensor)
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def batch_parallelism(mesh: Mesh) -> int:
    """How many ways the batch's leading axis is split (data x fsdp)."""
    return mesh.shape[DATA] * mesh.shape[FSDP]


def _names(path) -> list[str]:
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out.append(k.name)
    return out


def tensor_spec(names: list[str], ndim: int) -> list:
    """Megatron specs over TENSOR for the projection kernels / column biases (others: nothing)."""
    spec: list[str | None] = [None] * ndim
    owner = next((n for n in reversed(names) if n in _COLUMN or n in _ROW), None)
    last = names[-1] if names else ""
    if owner is None:
        return spec
    if last == "kernel" and ndim == 3:
        spec[2 if owner in _COLUMN else 1] = TENSOR
    elif last == "bias" and ndim == 2 and owner in _COLUMN:
        spec[1] = TENSOR
    return spec


def param_spec(path, leaf, mesh_axes: dict[str, int]) -> P:
    """PartitionSpec of one leaf of a parameter-shaped tree (params, reference, Adam moments, LoRA base)."""
    if not hasattr(leaf, "ndim") or leaf.ndim == 0:
        return P()
    names = _names(path)
    spec = tensor_spec(names, leaf.ndim) if mesh_axes.get(TENSOR, 1) > 1 else [None] * leaf.ndim
    f = mesh_axes.get(FSDP, 1)
    if f > 1 and math.prod(leaf.shape) >= _MIN_FSDP_SIZE:
        first = 1 if "layers" in names and leaf.ndim >= 2 else 0  # never the stacked-layer axis
        free = [d for d in range(first, leaf.ndim) if spec[d] is None and leaf.shape[d] % f == 0]
        if free:
            spec[max(free, key=lambda d: (leaf.shape[d], -d))] = FSDP
    return P(*spec)


def tree_shardings(tree: Any, mesh: Mesh) -> Any:
    """NamedShardings of a whole tree (TrainState, LoRA base): parameter-shaped leaves by param_spec, the
    rest (steps, controller states, PRNG keys) replicated."""
    axes = dict(mesh.shape)
    return jax.tree_util.tree_map_with_path(lambda p, x: NamedSharding(mesh, param_spec(p, x, axes)), tree)


def pool_shardings(pool: Any, mesh: Mesh) -> Any:
    """NamedShardings of a PoolState (grpo_jax.pool): every stacked member leaf [K, ...] has its K axis split
    over "data" (when data divides K) and its member dimensions sharded like the parameters (fsdp / tensor),
    so K snapshots cost each device K / data of them; the ring-buffer bookkeeping is replicated."""
    axes = dict(mesh.shape)
    rep = NamedSharding(mesh, P())

    def member(path, leaf):
        if not hasattr(leaf, "ndim") or leaf.ndim == 0:
            return rep
        inner = param_spec(path, jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype), axes)
        k_axis = DATA if axes[DATA] > 1 and leaf.shape[0] % axes[DATA] == 0 else None
        return NamedSharding(mesh, P(k_axis, *inner))

    out = jax.tree.map(lambda _: rep, pool)
    return dataclasses.replace(out, params=jax.tree_util.tree_map_with_path(member, pool.params))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding of every batch leaf: leading (prompt) axis over data x fsdp."""
    return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def put(tree: Any, shardings: Any) -> Any:
    """Host values (numpy, or arrays of this process) -> global arrays with `shardings` (one sharding or a
    tree of them). Every process must pass the same values; each builds only its addressable shards (works
    with one process or many, unlike device_put of a host array to another process's devices)."""
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    def one(x, sh):
        if x is None:  # an absent leaf (e.g. no LoRA base) stays absent whatever its sharding says
            return None
        if isinstance(x, jax.Array) and x.sharding == sh:
            return x
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.jit(lambda y: y, out_shardings=sh)(x)  # a global array: reshard on the devices
        a = np.asarray(x)
        return jax.make_array_from_callback(a.shape, sh, lambda idx: a[idx])

    return jax.tree.map(one, tree, shardings, is_leaf=lambda x: x is None)


def owned_rows(n_rows: int, sharding: NamedSharding) -> np.ndarray:
    """[n_rows] bool: the rows of a batch-sharded array that THIS process grades. A row belongs to the process
    of the lowest-numbered device holding it (rows replicated over the tensor axis are graded once)."""
    owner = np.full(n_rows, np.iinfo(np.int64).max)
    proc = np.full(n_rows, -1)
    # jax annotates devices_indices_map with `Device = xc.Device`, an alias mypy cannot resolve (jaxlib's
    # _jax extension has no stubs): jax.Device here
    placement: Mapping[jax.Device, Any] = sharding.devices_indices_map((n_rows,))
    for dev, idx in placement.items():
        rows = np.arange(n_rows)[idx[0]]
        better = dev.id < owner[rows]
        owner[rows[better]] = dev.id
        proc[rows[better]] = dev.process_index
    return proc == jax.process_index()


def to_host(tree: Any) -> Any:
    """Device arrays as numpy on this process: local or replicated arrays directly, arrays sharded over other
    processes' devices gathered from every process (a collective: every process must call it alike)."""

    def one(a):
        if not isinstance(a, jax.Array) or a.is_fully_addressable or a.is_fully_replicated:
            return np.asarray(a)
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(a, tiled=True))

    return jax.tree.map(one, tree)
