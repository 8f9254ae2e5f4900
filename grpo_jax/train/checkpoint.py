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

log = logging.getLogger(__name__)

STATE_ITEM = "state"
HOST_ITEM = "host"


class CheckpointMismatchError(ValueError):
    """The checkpoint's state tree does not match the restore template."""


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


class Checkpointer:
    """Saves / restores (TrainState, host JSON dict) at integer steps under one directory.

    keep: how many most recent steps to keep (older ones are deleted after a successful save).
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
        state_handler = ocp.StandardCheckpointHandler()
        host_handler = ocp.JsonCheckpointHandler()
        registry.add(STATE_ITEM, ocp.args.StandardSave, state_handler)
        registry.add(STATE_ITEM, ocp.args.StandardRestore, state_handler)
        registry.add(HOST_ITEM, ocp.args.JsonSave, host_handler)
        registry.add(HOST_ITEM, ocp.args.JsonRestore, host_handler)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            cleanup_tmp_directories=not read_only,  # remove leftovers of saves killed midway
            enable_async_checkpointing=False,
        )
        self._mngr = ocp.CheckpointManager(self.directory, options=options, handler_registry=registry)

    # -- queries -------------------------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        return sorted(int(s) for s in self._mngr.all_steps())

    def latest_step(self) -> int | None:
        """The last COMPLETE step (unfinished tmp directories are not steps), or None."""
        return self._mngr.latest_step()

    def should_save(self, step: int) -> bool:
        """True every `save_every` steps (step > 0), unless that step is already saved."""
        step = int(step)
        if self.save_every <= 0 or step <= 0 or step % self.save_every:
            return False
        return step not in self._mngr.all_steps()

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
        if step in self._mngr.all_steps():
            log.info("checkpoint step %d already exists in %s; not overwritten", step, self.directory)
            return False
        if not force and not self.should_save(step):
            return False
        saved = self._mngr.save(
            step,
            args=ocp.args.Composite(
                **{STATE_ITEM: ocp.args.StandardSave(state), HOST_ITEM: ocp.args.JsonSave(host)}
            ),
            force=True,  # the decision was made above; orbax's own interval policy is not used
        )
        self._mngr.wait_until_finished()
        return bool(saved)

    def restore(self, template_state: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore (state, host) of `step` (default: the latest complete one) into the template's structure.

        template_state: a pytree of the same structure as the saved state (concrete arrays or
        jax.ShapeDtypeStruct); its shardings are used for the restored arrays. Raises FileNotFoundError when
        there is no checkpoint and CheckpointMismatchError naming the leaves that differ.

        The restored arrays are committed to those shardings. A fresh `init_state(...)` is uncommitted, and
        jit compiles committed and uncommitted arguments separately: a process that steps both a fresh and a
        restored state (tests) compiles twice unless it commits the fresh one: `jax.device_put(state, dev)`.
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        step = int(step)
        if step not in self._mngr.all_steps():
            raise FileNotFoundError(
                f"checkpoint step {step} not found in {self.directory}; complete steps: {self.all_steps()}"
            )
        abstract = _abstract(template_state)
        self._check_structure(step, abstract)
        restored = self._mngr.restore(
            step,
            args=ocp.args.Composite(
                **{STATE_ITEM: ocp.args.StandardRestore(abstract), HOST_ITEM: ocp.args.JsonRestore()}
            ),
        )
        state = restored[STATE_ITEM]
        # orbax returns the template's container types; check the tree structure once more to be sure
        if jax.tree.structure(state) != jax.tree.structure(abstract):
            raise CheckpointMismatchError(
                f"restored tree structure differs from the template's (step {step} in {self.directory})"
            )
        return state, dict(restored[HOST_ITEM] or {})

    def _check_structure(self, step: int, abstract: Any) -> None:
        meta = self._mngr.item_metadata(step)
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

    def __init__(self):
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
