"""Checkpoints of the whole RL state (orbax) plus host-side JSON, for bit-exact resumption.

One checkpoint step holds two items, written together by one orbax `CheckpointManager` save:

  state  the TrainState pytree (params, optimiser state, controller states, reference params, PRNG streams,
         step) via `StandardSave`; None leaves (e.g. `ref_params=None`, optax `EmptyState`) are kept as
         empty nodes.
  host   a JSON dict via `JsonSave`: data / curriculum cursor, replay contents, config dict, tokenizer
         fingerprint, ... (JSON semantics: tuples come back as lists, dict keys as strings).

Restoring goes INTO the structure of a template state (a fresh `init_state(...)` or its `jax.eval_shape`), so
optax NamedTuples, flax dataclasses and None leaves come back as the same types; the saved tree is first
compared with the template leaf by leaf (name, shape, dtype) and any difference is reported by name.

Atomicity: orbax writes a step to `<step>.orbax-checkpoint-tmp-<n>` and renames it to `<step>` when complete,
so a save killed midway leaves only a tmp directory, which `latest_step`/`restore` ignore (and a new
Checkpointer deletes). Saves here block until the step is durable (simplicity over async saving).

Integrity: orbax 0.12.8 checks no data (TensorStore's zarr3 layout has a CRC32C over each shard's index only,
and the OCDBT files none), so a damaged chunk file either fails deep in TensorStore (OUT_OF_RANGE) or restores
wrong values. After orbax finalizes a step, the primary process writes `<step>/grpo_checksums.json` (the
SHA-256 and size of every file of the step; temp file + rename); `check(step)` compares them. `restore()`
without a step takes the newest INTACT step, skipping corrupt ones (`last_restore` says which, and why); a
step saved before checksums were recorded (or killed between orbax's rename and the checksum file) has none
and is trusted, but if it cannot be read it is skipped too. An explicit step that is corrupt, or no intact
step at all, is CheckpointCorruptError (nothing is deleted).

Rotation (`keep`): done here, not by orbax. After a save, the `keep` newest intact steps are kept, older
intact steps are deleted, and corrupt steps older than the newest intact one are deleted; a corrupt step
newer than every intact one is kept (for inspection) until a save of that step replaces it. So a save never
deletes an intact step while leaving only corrupt ones: the step it just wrote (intact: its checksums were
taken from the files on disk) is always kept. Each step is hashed at most once per process (the result is
cached), besides the hashing of a save.

`SignalFlag` turns SIGTERM / SIGINT into a flag that the host loop checks between steps, so a preempted run
saves and exits cleanly instead of dying mid-step:

    flag = SignalFlag.install()
    for ...:
        state, metrics = train_step(state, batch)
        if ckpt.should_save(step) or flag.is_set():
            ckpt.save(step, state, host, force=flag.is_set())
        if flag.is_set():
            break
    flag.uninstall()
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from grpo_jax import atomic

log = logging.getLogger(__name__)

STATE_ITEM = "state"
HOST_ITEM = "host"
CHECKSUMS_FILE = "grpo_checksums.json"  # in each step directory: {"files": {relpath: {"sha256", "size"}}}


class CheckpointMismatchError(ValueError):
    """The checkpoint's state tree does not match the restore template."""


class CheckpointCorruptError(ValueError):
    """The step asked for is corrupt, or no step of the directory is intact (nothing was deleted)."""


@dataclasses.dataclass(frozen=True)
class RestoreInfo:
    """What the last `Checkpointer.restore` did: the step it restored and the newer steps it skipped."""

    step: int
    skipped: tuple[tuple[int, str], ...] = ()  # (step, why it is corrupt), newest first

    def line(self, directory: str, doing: str = "resuming from") -> str | None:
        """The one line that says which corrupt steps were skipped (None when none was)."""
        if not self.skipped:
            return None
        if len(self.skipped) == 1:
            ((s, why),) = self.skipped
            what = f"step {s} in {directory} is corrupt ({why})"
        else:
            steps = ", ".join(str(s) for s, _ in self.skipped)
            whys = "; ".join(f"step {s}: {w}" for s, w in self.skipped)
            what = f"steps {steps} in {directory} are corrupt ({whys})"
        return f"checkpoint {what}: {doing} step {self.step}, the newest intact one"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _step_files(step_dir: str) -> list[str]:
    """Every file below a step directory (relative paths, sorted) but the checksum file and its temp files."""
    out = []
    for root, _, files in os.walk(step_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), step_dir)
            if not rel.startswith(CHECKSUMS_FILE):
                out.append(rel)
    return sorted(out)


def _key_name(k: Any) -> str:
    for attr in ("name", "key", "idx"):  # GetAttrKey, DictKey / FlattenedIndexKey, SequenceKey
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _leaf_specs(tree: Any, is_leaf=None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{dotted leaf name (orbax's naming, e.g. 'opt_state.inner_state.1.0.mu.embed'): (shape, dtype)}."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    out = {}
    for path, leaf in flat:
        out[".".join(_key_name(k) for k in path)] = (tuple(np.shape(leaf)), np.dtype(leaf.dtype))
    return out


def _describe_mismatch(saved: dict, wanted: dict, limit: int = 8) -> str:
    missing = sorted(set(wanted) - set(saved))
    extra = sorted(set(saved) - set(wanted))
    differ = sorted(k for k in set(saved) & set(wanted) if saved[k] != wanted[k])
    parts = []

    def fmt(names, render):
        shown = ", ".join(render(n) for n in names[:limit])
        return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")

    if missing:
        parts.append(f"in the template but not in the checkpoint: {fmt(missing, str)}")
    if extra:
        parts.append(f"in the checkpoint but not in the template: {fmt(extra, str)}")
    if differ:

        def render(n):
            (s_shape, s_dtype), (w_shape, w_dtype) = saved[n], wanted[n]
            return f"{n} (checkpoint {s_dtype}{list(s_shape)} vs template {w_dtype}{list(w_shape)})"

        parts.append(f"shape/dtype differs: {fmt(differ, render)}")
    return "; ".join(parts)


def _abstract(template: Any) -> Any:
    """Template leaves -> ShapeDtypeStruct (keeping shardings), so donated/deleted buffers are never read."""

    def one(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x

    return jax.tree.map(one, template)


class _Unreadable(Exception):
    """A step without checksums that orbax could not read (treated as corrupt)."""


class _StateHandler(ocp.StandardCheckpointHandler):
    """orbax's StandardCheckpointHandler (the same save, restore and metadata) writing the arrays without
    zstd compression: compressing float weights and moments saves little, and TensorStore's compression
    buffers raised a save's peak RSS by ~0.8x the state's bytes (a SmolLM2 full fine-tuning state of 1.6 GB:
    +1.3 GB; uncompressed +0.01 GB). The price is disk: a SmolLM2 step is 1.58 GB instead of 1.46 GB (step
    0, whose AdamW moments are zeros, instead of 0.33 GB). Restore reads either kind of step."""

    def __init__(self):
        super().__init__()
        # the handler StandardCheckpointHandler builds itself, with use_compression=False (not a parameter of
        # StandardCheckpointHandler in orbax-checkpoint 0.12.8)
        self._impl = ocp.PyTreeCheckpointHandler(
            save_concurrent_gb=96, restore_concurrent_gb=96, use_ocdbt=True, use_compression=False
        )


class Checkpointer:
    """Saves / restores (TrainState, host JSON dict) at integer steps under one directory.

    keep: how many most recent INTACT steps to keep (older ones are deleted after a successful save; see the
    module docstring for corrupt steps).
    save_every: `should_save(step)` is true every `save_every` steps (0: only explicit/forced saves).
    read_only: a reader of another run's checkpoints (the evaluator, export): the temporary directories of
    saves in progress are left alone (a writer removes those its killed saves left behind).
    """

    def __init__(
        self, directory: str | os.PathLike, *, keep: int = 3, save_every: int = 0, read_only: bool = False
    ):
        if keep < 1:
            raise ValueError(f"Checkpointer keep={keep}: must be >= 1")
        if save_every < 0:
            raise ValueError(f"Checkpointer save_every={save_every}: must be >= 0 (0 = only forced saves)")
        self.directory = os.path.abspath(os.fspath(directory))  # orbax needs absolute paths
        self.keep = keep
        self.save_every = save_every
        registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
        state_handler = _StateHandler()
        host_handler = ocp.JsonCheckpointHandler()
        registry.add(STATE_ITEM, ocp.args.StandardSave, state_handler)
        registry.add(STATE_ITEM, ocp.args.StandardRestore, state_handler)
        registry.add(HOST_ITEM, ocp.args.JsonSave, host_handler)
        registry.add(HOST_ITEM, ocp.args.JsonRestore, host_handler)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # rotation is done here (_rotate): it never leaves only corrupt steps
            create=True,
            cleanup_tmp_directories=not read_only,  # remove leftovers of saves killed midway
            enable_async_checkpointing=False,
        )
        self._mngr = ocp.CheckpointManager(self.directory, options=options, handler_registry=registry)
        self._checked: dict[int, str | None] = {}  # step -> why it is corrupt (None: intact), hashed once
        self.last_restore: RestoreInfo | None = None

    # -- queries -------------------------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        return sorted(int(s) for s in self._mngr.all_steps())

    def latest_step(self) -> int | None:
        """The last COMPLETE step (unfinished tmp directories are not steps), or None."""
        return self._mngr.latest_step()

    def should_save(self, step: int) -> bool:
        """True every `save_every` steps (step > 0), unless that step is already saved (and intact)."""
        step = int(step)
        if self.save_every <= 0 or step <= 0 or step % self.save_every:
            return False
        return step not in self._mngr.all_steps() or self.check(step) is not None

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(int(step)))

    def check(self, step: int) -> str | None:
        """Why complete step `step` is corrupt (one short phrase), or None when it is intact: every file its
        checksum file lists is there with the recorded size and SHA-256. A step without a checksum file (saved
        before they were recorded) is trusted (None). Cached: each step is hashed once per Checkpointer."""
        step = int(step)
        if step not in self._checked:
            self._checked[step] = self._verify(self.step_dir(step))
        return self._checked[step]

    def intact_steps(self) -> list[int]:
        return [s for s in self.all_steps() if self.check(s) is None]

    @staticmethod
    def _verify(step_dir: str) -> str | None:
        path = os.path.join(step_dir, CHECKSUMS_FILE)
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                files = {k: (int(v["size"]), str(v["sha256"])) for k, v in json.load(f)["files"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"its {CHECKSUMS_FILE} is unreadable ({type(e).__name__})"
        bad = []
        for rel, (size, sha) in sorted(files.items()):
            full = os.path.join(step_dir, rel)
            if not os.path.isfile(full):
                bad.append(f"{rel} missing")
            elif os.path.getsize(full) != size:
                bad.append(f"{rel} {os.path.getsize(full)} bytes, {size} when saved")
            elif _sha256(full) != sha:
                bad.append(f"{rel} SHA-256 differs")
        if not bad:
            return None
        more = f"; {len(bad) - 2} more" if len(bad) > 2 else ""
        return f"{len(bad)} of {len(files)} files damaged: {'; '.join(bad[:2])}{more}"

    def _write_checksums(self, step: int) -> None:
        """The SHA-256 and size of every file of the (finalized) step, atomically (temp + fsync + rename)."""
        step_dir = self.step_dir(step)
        files = {}
        for rel in _step_files(step_dir):
            full = os.path.join(step_dir, rel)
            files[rel] = {"sha256": _sha256(full), "size": os.path.getsize(full)}
        doc = {"step": step, "algorithm": "sha256", "files": files}
        atomic.write_json(
            os.path.join(step_dir, CHECKSUMS_FILE), doc, newline=False, indent=0, sort_keys=True
        )

    def _delete(self, step: int) -> None:
        self._mngr.delete(step)
        self._checked.pop(step, None)

    def _rotate(self) -> None:
        """Keep the `keep` newest intact steps; delete older intact steps and the corrupt steps older than the
        newest intact one (the module docstring says what is guaranteed)."""
        n_intact = 0
        for s in sorted(self.all_steps(), reverse=True):
            why = self.check(s)
            if why is None and n_intact < self.keep:
                n_intact += 1
            elif n_intact:  # an older intact step beyond `keep`, or a corrupt one below an intact step
                log.info(
                    "checkpoint step %d deleted (%s)", s, "rotation" if why is None else f"corrupt: {why}"
                )
                self._delete(s)

    # -- save / restore ------------------------------------------------------------------------------------
    def save(self, step: int, state: Any, host: dict, *, force: bool = False) -> bool:
        """Write (state, host) as `step`; block until it is durable. Returns whether a checkpoint was written.

        Without `force`, only steps where `should_save(step)` holds are written. A step that already exists is
        never overwritten (False): with deterministic training its contents would be the same.
        """
        step = int(step)
        if not isinstance(host, dict):
            raise TypeError(
                f"Checkpointer.save: host must be a dict (JSON object), got {type(host).__name__}"
            )
        try:
            json.dumps(host)
        except (TypeError, ValueError) as e:  # fail before anything is written
            raise ValueError(f"Checkpointer.save: the host dict is not JSON-serialisable: {e}") from e
        if not force and not self.should_save(step):
            return False
        if step in self._mngr.all_steps():
            why = self.check(step)
            if why is None:
                log.info("checkpoint step %d already exists in %s; not overwritten", step, self.directory)
                return False
            log.info("checkpoint step %d in %s is corrupt (%s): written anew", step, self.directory, why)
            self._delete(step)
        saved = self._mngr.save(
            step,
            args=ocp.args.Composite(
                **{STATE_ITEM: ocp.args.StandardSave(state), HOST_ITEM: ocp.args.JsonSave(host)}
            ),
            force=True,  # the decision was made above; orbax's own interval policy is not used
        )
        self._mngr.wait_until_finished()
        if saved:
            if jax.process_index() == 0:
                self._write_checksums(step)
            self._checked[step] = None
            self._rotate()
        return bool(saved)

    def restore(self, template_state: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore (state, host) of `step` (default: the newest intact one) into the template's structure.

        template_state: a pytree of the same structure as the saved state (concrete arrays or
        jax.ShapeDtypeStruct); its shardings are used for the restored arrays. Raises FileNotFoundError when
        there is no checkpoint (or no step `step`), CheckpointCorruptError when `step` is corrupt or no step
        is intact (both listing the intact steps), and CheckpointMismatchError naming the leaves that differ.
        `self.last_restore` records the step restored and the corrupt newer steps skipped.

        The restored arrays are committed to those shardings. A fresh `init_state(...)` is uncommitted, and
        jit compiles committed and uncommitted arguments separately: a process that steps both a fresh and a
        restored state (tests) compiles twice unless it commits the fresh one: `jax.device_put(state, dev)`.
        """
        abstract = _abstract(template_state)
        steps = self.all_steps()
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        if step is not None:
            step = int(step)
            if step not in steps:
                raise FileNotFoundError(
                    f"checkpoint step {step} not found in {self.directory}; "
                    f"intact steps: {self.intact_steps()}"
                )
            why = self.check(step)
            if why is None:
                try:
                    return self._restore_intact(step, abstract, [])
                except _Unreadable as e:
                    why = str(e)
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory} is corrupt ({why}); intact steps: "
                f"{[s for s in self.intact_steps() if s != step]}"
            )
        skipped: list[tuple[int, str]] = []
        for s in sorted(steps, reverse=True):
            why = self.check(s)
            if why is None:
                try:
                    return self._restore_intact(s, abstract, skipped)
                except _Unreadable as e:
                    why = str(e)
            log.info("checkpoint step %d in %s is corrupt (%s): skipped", s, self.directory, why)
            skipped.append((s, why))
        listed = "; ".join(f"step {s}: {why}" for s, why in skipped)
        raise CheckpointCorruptError(
            f"no intact checkpoint in {self.directory} ({listed}); nothing was deleted"
        )

    def _restore_intact(self, step: int, abstract: Any, skipped: list) -> tuple[Any, dict]:
        """Restore a step that passed `check`. A step without checksums that cannot be read raises
        _Unreadable (the caller treats it as corrupt); a step with checksums raises what orbax raised."""
        self._check_structure(step, abstract)
        try:
            restored = self._mngr.restore(
                step,
                args=ocp.args.Composite(
                    **{STATE_ITEM: ocp.args.StandardRestore(abstract), HOST_ITEM: ocp.args.JsonRestore()}
                ),
            )
        except (ValueError, OSError) as e:
            self._unreadable(step, e)
        state = restored[STATE_ITEM]
        # orbax returns the template's container types; check the tree structure once more to be sure
        # the ignore: jax's PyTreeDef aliases jaxlib's pytree extension class, which ships no stubs
        if jax.tree.structure(state) != jax.tree.structure(abstract):  # type: ignore[operator]
            raise CheckpointMismatchError(
                f"restored tree structure differs from the template's (step {step} in {self.directory})"
            )
        self.last_restore = RestoreInfo(step, tuple(skipped))
        return state, dict(restored[HOST_ITEM] or {})

    def _unreadable(self, step: int, e: Exception) -> None:
        """orbax could not read `step`: re-raise if it has checksums (they matched: not corruption), else it
        counts as corrupt (_Unreadable, with the error's start)."""
        if os.path.exists(os.path.join(self.step_dir(step), CHECKSUMS_FILE)):
            raise e
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        why = f"unreadable, and saved without checksums: {first[:160]}{'...' if len(first) > 160 else ''}"
        self._checked[step] = why
        raise _Unreadable(why) from e

    def _check_structure(self, step: int, abstract: Any) -> None:
        try:
            meta = self._mngr.item_metadata(step)
        except (ValueError, OSError) as e:
            self._unreadable(step, e)
        tree = meta[STATE_ITEM]
        tree = getattr(tree, "tree", tree)  # TreeMetadata wraps the plain nested metadata tree
        saved = _leaf_specs(tree, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
        wanted = _leaf_specs(abstract)
        if saved != wanted:
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} does not match the restore template: "
                + _describe_mismatch(saved, wanted)
            )

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SignalFlag:
    """A flag set by a signal (default SIGTERM, SIGINT), checked by the host loop between steps.

    `SignalFlag.install()` replaces the handlers of `signals` (main thread only) and returns the flag;
    `uninstall()` puts the previous handlers back. A second SIGINT while the flag is already set raises
    KeyboardInterrupt, so Ctrl-C twice still stops a loop that hangs.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._previous: dict[int, Any] = {}
        self.signum: int | None = None  # the last signal received

    @classmethod
    def install(cls, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> SignalFlag:
        flag = cls()
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SignalFlag.install must be called from the main thread (Python signal rule)")
        try:
            for s in signals:
                s = signal.Signals(s)
                flag._previous[s] = signal.signal(s, flag._handle)
        except BaseException:
            flag.uninstall()
            raise
        return flag

    def _handle(self, signum, frame):
        if self._event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        self._event.set()
        log.warning("received %s: will save and stop after the current step", signal.Signals(signum).name)

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()
        self.signum = None

    def uninstall(self) -> None:
        """Restore the handlers that were active before install (idempotent)."""
        while self._previous:
            s, prev = self._previous.popitem()
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.uninstall()
