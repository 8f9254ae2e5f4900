"""Reading a GGUF file (no JAX): its metadata and its tensors' raw data, shared by the tokenizer rebuilt from
a GGUF (grpo_jax.tokenization.hf) and the model loader (grpo_jax.pretrained.gguf).

Our own parser of the GGUF container (versions 2 and 3, little-endian; the layout of the GGUF specification
in the ggml repository): the header, the key/value metadata, the tensor infos, then the aligned data
section, which is memory-mapped, never read whole. `gguf.GGUFReader` (the `gguf` package) builds a numpy
view per array element of the metadata: 6-9 s for the 49 152 tokens and 48 900 merges of SmolLM2-135M's
tokenizer on a 2-core CPU, paid on every load. This parser decodes the same values with `struct` in about
a tenth of a second. The tensor data it returns have the shapes and dtypes `gguf.quants.dequantize`
expects (the same as `GGUFReader`'s); tests/test_gguf.py checks every field and tensor against it.

A truncated or malformed file gets one ValueError naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (the GGUF specification's `gguf_metadata_value_type`): the scalars' struct format
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# numpy dtypes of the unquantized tensor types (GGMLQuantizationType values); everything else is raw bytes
_TENSOR_DTYPES = {
    0: np.float32,
    1: np.float16,
    24: np.int8,
    25: np.int16,
    26: np.int32,
    27: np.int64,
    28: np.float64,
}


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[
        int, ...
    ]  # GGML order (ne): the fastest-varying dimension first, e.g. (D, V) for the embedding
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # memory-mapped; numpy order (reversed ne), quantized types as uint8 rows of blocks


@dataclasses.dataclass
class GGUFFile:
    path: str
    version: int
    fields: dict[str, Any]  # key -> decoded value (str / int / float / bool / list)
    tensors: list[GGUFTensor]
    alignment: int
    data_offset: int


class _Cursor:
    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def fail(self, what: str) -> ValueError:
        return ValueError(
            f"{self.path}: {what} (at byte {self.pos} of {self.size}: truncated or not a GGUF file)"
        )

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize("<" + fmt)
        if self.pos + n > self.size:
            raise self.fail(f"ends inside {what}")
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        (n,) = self.unpack("Q", what)
        if self.pos + n > self.size:
            raise self.fail(f"ends inside {what} ({n} bytes)")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype], what)[0]
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype, count = self.unpack("IQ", what)
            if etype in _SCALAR:
                fmt = _SCALAR[etype]
                n = struct.calcsize("<" + fmt) * count
                if self.pos + n > self.size:
                    raise self.fail(f"ends inside {what} ({count} elements)")
                out = list(struct.unpack_from(f"<{count}{fmt}", self.buf, self.pos))
                self.pos += n
                return out
            return [self.value(etype, what) for _ in range(count)]
        raise self.fail(f"{what} has unknown value type {vtype} (valid: 0-12)")


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse `path`'s header, metadata and tensor infos; tensor data stay memory-mapped."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 24:
            raise ValueError(f"{path}: not a GGUF file ({os.fstat(f.fileno()).st_size} bytes, too short)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if buf[:4] != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file (first bytes {bytes(buf[:4])!r}, expected b'GGUF')")
    c = _Cursor(buf, path)
    c.pos = 4
    (version,) = c.unpack("I", "the version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
        raise ValueError(
            f"{path}: GGUF version {version}{hint} is not supported (valid: 2, 3, little-endian)"
        )
    n_tensors, n_kv = c.unpack("QQ", "the header")
    fields: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        (vtype,) = c.unpack("I", f"the type of {key!r}")
        fields[key] = c.value(vtype, f"metadata {key!r}")
    infos = []
    for i in range(n_tensors):
        name = c.string(f"tensor name {i}")
        (n_dims,) = c.unpack("I", f"tensor {name!r}")
        dims = c.unpack(f"{n_dims}Q", f"tensor {name!r}")
        raw_type, offset = c.unpack("IQ", f"tensor {name!r}")
        infos.append((name, tuple(int(d) for d in dims), raw_type, offset))
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{path}: general.alignment={alignment!r} (valid: a power of two)")
    data_offset = -(-c.pos // alignment) * alignment
    arr = np.frombuffer(buf, dtype=np.uint8)
    tensors, names = [], set()
    for name, dims, raw_type, offset in infos:
        if name in names:
            raise ValueError(f"{path}: tensor {name!r} appears twice")
        names.add(name)
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise ValueError(f"{path}: tensor {name!r} has unknown type {raw_type}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        n_elems = int(np.prod(dims, dtype=np.int64))
        n_bytes = n_elems * type_size // block
        start = data_offset + offset
        if start + n_bytes > len(buf):
            raise ValueError(
                f"{path}: tensor {name!r} needs bytes {start}..{start + n_bytes} but the file has {len(buf)} "
                "(truncated)"
            )
        np_shape = tuple(reversed(dims))
        raw = arr[start : start + n_bytes]
        if raw_type in _TENSOR_DTYPES:
            data = raw.view(_TENSOR_DTYPES[raw_type]).reshape(np_shape)
        else:
            data = raw.reshape(quant_shape_to_byte_shape(np_shape, qtype))
        tensors.append(GGUFTensor(name, dims, qtype, data))
    return GGUFFile(path, version, fields, tensors, alignment, data_offset)


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """The parsed GGUF file at `path`; one clear error for a missing, truncated or non-GGUF file."""
    return read_gguf(path)


def field_value(reader: GGUFFile, key: str, default: Any = None) -> Any:
    """The decoded value of metadata field `key` (str / int / float / bool / list), or `default` if absent."""
    return reader.fields.get(key, default)
