"""Named PRNG streams and named sub-keys: every random choice of a run has a key of its own.

The run seed is split ONCE into named streams (`streams(seed)`); a key is then a path below a stream:

    key = derive(streams["rollout"], step, "policy_sample", round)     # ints are folded as they are,
    key = derive(streams["init"], "model")                              # names by a 32-bit hash of the name

so the key of step n never depends on how many keys earlier code drew (docs/ARCHITECTURE.md §3 rule 5), and
two
consumers never share a key as long as each one gets its own name. Consumers fold only small integers (token
index, member index) into the key they are given; name hashes are forced >= 2**24 so a name never collides
with such an index below the same parent key. `tests/test_rollout.py` checks that all keys of one step are
pairwise distinct.
"""

from __future__ import annotations

import hashlib

import jax

STREAMS = ("init", "sft", "rollout", "train", "eval")
_NAME_FLOOR = 1 << 24


def name_id(name: str) -> int:
    """A stable 32-bit id of `name` (SHA-256 based), always >= 2**24 (above any index a consumer folds)."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    return _NAME_FLOOR + h % ((1 << 32) - _NAME_FLOOR)


def derive(key: jax.Array, *path: int | str | jax.Array) -> jax.Array:
    """fold_in every element of `path` into `key`: ints as they are (steps, rounds), strings by `name_id`."""
    for p in path:
        if isinstance(p, str):
            key = jax.random.fold_in(key, name_id(p))
        elif isinstance(p, int) and not isinstance(p, bool):
            if p < 0:
                raise ValueError(f"rng.derive: negative index {p} in {path}")
            key = jax.random.fold_in(key, p)
        else:
            key = jax.random.fold_in(key, p)  # a traced integer (e.g. a step inside jit)
    return key


def streams(seed: int) -> dict[str, jax.Array]:
    """{stream name: raw uint32 key} split once from `seed` (checkpointable: plain arrays)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), len(STREAMS))
    return {name: keys[i] for i, name in enumerate(STREAMS)}
