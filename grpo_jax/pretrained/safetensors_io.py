"""A small, dependency-free reader / writer of the safetensors format (numpy + the ml_dtypes that JAX ships).

Format (https://github.com/huggingface/safetensors, README "Format"): 8 bytes little-endian u64 N, then N
bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the byte buffer; offsets are relative to the buffer start, tensors are C-contiguous little-endian.

Why not `safetensors.numpy`: it cannot represent bfloat16. `read` memory-maps the file, so a tensor is read
from disk only when it is used (each one once), and a bfloat16 tensor is an `ml_dtypes.bfloat16` array.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import ml_dtypes  # a dependency of jax: numpy's bfloat16
import numpy as np

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
_NAMES = {v: k for k, v in _DTYPES.items()}

_MAX_HEADER = 100_000_000  # the reference implementation's limit


class SafetensorsError(ValueError):
    """A file that is not valid safetensors (truncated, a garbled header), or a dtype this reader does not
    know; names the file and what is wrong."""


def read_header(path: str) -> tuple[dict[str, dict], dict[str, str], int]:
    """(tensor entries, __metadata__, byte offset of the data buffer) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: too short for a safetensors file ({len(raw)} bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER:
            raise SafetensorsError(f"{path}: header length {n} > {_MAX_HEADER}: not a safetensors file")
        raw = f.read(n)
        if len(raw) < n:
            raise SafetensorsError(
                f"{path}: header of {n} bytes but the file ends after {8 + len(raw)} (truncated, or not a "
                "safetensors file)"
            )
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not JSON ({e}): not a safetensors file") from e
    if not isinstance(header, dict):
        raise SafetensorsError(
            f"{path}: header is JSON {type(header).__name__}, not an object {{tensor: entry}}: "
            "not a safetensors file"
        )
    meta = header.pop("__metadata__", None) or {}
    return header, meta, 8 + n


def _entry(path: str, name: str, e: Any) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype code, shape, begin, end) of a header entry; SafetensorsError for one that is malformed."""
    try:
        code, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise ValueError
        if not (isinstance(b, int) and isinstance(end, int) and 0 <= b <= end):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise SafetensorsError(
            f"{path}: tensor {name!r} has a malformed header entry {str(e)[:200]} (valid: "
            '{"dtype": str, "shape": [ints >= 0], "data_offsets": [begin, end]}): not a safetensors file'
        ) from None
    return code, tuple(shape), b, end


def read(path: str) -> dict[str, np.ndarray]:
    """{name: read-only np.memmap view} of every tensor of a safetensors file (nothing is read yet)."""
    header, _, start = read_header(path)
    size = os.path.getsize(path)
    out: dict[str, np.ndarray] = {}
    for name, e in header.items():
        code, shape, b, end = _entry(path, name, e)
        if code not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has dtype {code!r}; readable: {sorted(_DTYPES)}")
        dt = _DTYPES[code]
        count = int(np.prod(shape, dtype=np.int64))
        if end - b != count * dt.itemsize:
            raise SafetensorsError(
                f"{path}: tensor {name!r} offsets {b}..{end} do not match shape {shape} x {code} "
                f"({count * dt.itemsize} bytes)"
            )
        if start + end > size:
            raise SafetensorsError(
                f"{path}: tensor {name!r} needs bytes {start + b}..{start + end} but the file has {size} "
                "(truncated)"
            )
        if count == 0:
            out[name] = np.zeros(shape, dt)
        else:
            out[name] = np.memmap(path, dtype=dt, mode="r", offset=start + b, shape=shape)
    return out


def write(path: str, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> None:
    """Write {name: array} as one safetensors file (header padded with spaces to a multiple of 8, as the
    reference writer does). Arrays are converted with np.asarray (jax arrays are fetched to the host)."""
    entries: dict[str, Any] = {}
    arrays = []
    off = 0
    for name in tensors:
        a = np.asarray(tensors[name])
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        a = np.ascontiguousarray(a)
        code = _NAMES.get(a.dtype)
        if code is None:
            raise SafetensorsError(
                f"{path}: tensor {name!r} has dtype {a.dtype}; writable: {sorted(_DTYPES)}"
            )
        entries[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        arrays.append(a)
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    header.update(entries)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for a in arrays:
            f.write(a.tobytes())
