"""Multi-process / multi-host runs on JAX's own distributed runtime (multi-controller SPMD).

    distributed.initialize(cfg.dist)       # before anything touches a JAX device (experiments/codegen.py)
    ctx = distributed.context(cfg.dist)    # process index / count, host-side exchange, step barriers

Every process runs the same program on the same data: the same problems are drawn from the same keys, the
device computations are global `jax.Array`s over the mesh of all processes' devices, and host-side state
(the curriculum, replay, pass counts) is computed identically everywhere from identical inputs. The few
things a process does alone go through this module:

  grading     each process grades its own rows of the batch (sharding.owned_rows) in its own sandbox
              workers; `ctx.allgather_objects` exchanges the verdicts, so every process holds all of them;
  host reads  `ctx.host(x)` fetches a sharded array to every process (process_allgather) or a replicated /
              local one directly;
  one writer  process 0 (`ctx.is_main`) writes logs, TensorBoard, run.json and results.json; orbax writes
              checkpoints collectively (every process calls save / restore);
  failures    a watchdog thread per process heartbeats through the key-value store and ends the process
              (exit 75, a line naming the lost process) when a peer stops heartbeating (`--dist_heartbeat_s`;
              JAX's own detection, at twice that, is the fallback), when the coordinator is unreachable, or
              when its GRPO step makes no progress for `--dist_step_timeout_s` (naming the processes behind);
              every step starts at a barrier and the grade exchange waits at most that long (`PeerLost`).

Host-side exchange uses the coordination service's key-value store (the same channel orbax uses), so it
needs no extra ports. CPU collectives use gloo (`jax_cpu_collectives_implementation`), so all of this runs on
one machine with forced CPU devices (launch/local.py, tests/test_distributed.py).
"""

from __future__ import annotations

import base64
import dataclasses
import pickle
import sys
import threading
import time
from typing import Any, TypedDict

import jax

_INITIALIZED = False


class PeerLost(RuntimeError):
    """Another process of the run did not arrive in time (hung or dead)."""


def initialize(dist) -> None:
    """Join the run's processes (grpo_jax.config.DistConfig `dist`); a no-op for a single-process run.

    Must run before any JAX computation. On CPU the collectives go through gloo."""
    global _INITIALIZED
    if not dist.enabled or _INITIALIZED:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kw = dict(
        initialization_timeout=dist.init_timeout_s,
        # JAX's own detection is the fallback: twice ours, so the watchdog's clearer message comes first
        heartbeat_timeout_seconds=2 * dist.heartbeat_s,
    )
    if dist.coordinator:
        kw.update(
            coordinator_address=dist.coordinator,
            num_processes=dist.num_processes,
            process_id=dist.process_id,
            # explicit means explicit: JAX would otherwise still run its cluster detection (which, under
            # srun / mpirun on GPUs, limits each process to one local device)
            cluster_detection_method="deactivate",
        )
    try:
        jax.distributed.initialize(**kw)
    except Exception as e:  # e.g. the coordinator is unreachable, or no cluster was detected
        where = dist.coordinator or "auto-detected cluster"
        raise PeerLost(
            f"jax.distributed.initialize ({where}) failed: {str(e).splitlines()[0][:300]}; check "
            "--dist_coordinator / --dist_num_processes / --dist_process_id (or the cluster's environment "
            f"for --dist_cluster=auto) and that every process was started within --dist_init_timeout_s="
            f"{dist.init_timeout_s}"
        ) from None
    _INITIALIZED = True
    if jax.process_count() > 1:
        args = (jax.process_index(), jax.process_count(), dist.heartbeat_s, dist.step_timeout_s)
        threading.Thread(target=_watchdog, args=args, daemon=True).start()


class _Progress(TypedDict):
    armed: bool
    count: int
    label: str
    since: float


# where this process's GRPO step is (Context.progress), read by the watchdog; "armed" only inside a step
_PROGRESS: _Progress = {"armed": False, "count": 0, "label": "starting", "since": time.monotonic()}


def _watchdog(me: int, count: int, timeout_s: float, step_timeout_s: float, every_s: float = 0.5) -> None:
    """Heartbeats through the coordinator's key-value store, each carrying this process's progress. Ends THIS
    process (fail_lost) with a message naming the lost process when
      - a peer's heartbeat has not moved for timeout_s (dead, stopped, or its host lost),
      - the coordinator cannot be reached (process 0 lost), or
      - this process's GRPO step has made no progress for step_timeout_s (it waits on a hung peer, e.g. in a
        collective; the peers that are behind it are named),
    whatever the main thread is blocked in, so the run ends within a bounded time instead of hanging."""
    client = _client()
    seen: dict[int, tuple[str | None, float]] = {p: (None, time.monotonic()) for p in range(count) if p != me}
    where = dict.fromkeys(seen, (0, "starting"))
    beat, unreachable_since = 0, None
    while True:
        beat += 1
        now = time.monotonic()
        pr = _PROGRESS.copy()
        try:
            mine = f"{beat}|{pr['count']}|{pr['label']}"
            client.key_value_set(f"grpo_jax/heartbeat/{me}", mine, allow_overwrite=True)
            for p, (value, since) in seen.items():
                try:
                    v = client.key_value_try_get(f"grpo_jax/heartbeat/{p}")
                except Exception:  # not written yet (still starting up)
                    v = None
                if v is not None:
                    _, n, label = v.split("|", 2)
                    where[p] = (int(n), label)
                if v != value:
                    seen[p] = (v, now)
                elif now - since > timeout_s:
                    fail_lost(
                        PeerLost(
                            f"lost process {p} of {count}: no heartbeat for {now - since:.0f} s "
                            f"(--dist_heartbeat_s={timeout_s:g}); it died, hung hard or its host is lost"
                        )
                    )
            unreachable_since = None
            if pr["armed"] and now - pr["since"] > step_timeout_s:
                fail_lost(PeerLost(_stall_message(me, pr, where, now, step_timeout_s)))
        except Exception as e:
            unreachable_since = unreachable_since or now
            if now - unreachable_since > min(timeout_s, 5.0):
                fail_lost(
                    PeerLost(
                        f"lost process 0 of {count} (the coordinator): its key-value store is unreachable "
                        f"({str(e).splitlines()[0][:200]})"
                    )
                )
        time.sleep(every_s)


def _stall_message(me: int, pr: _Progress, where: dict, now: float, step_timeout_s: float) -> str:
    """Why this process's step stalled: the peers that are behind it, or that it is the one behind."""
    behind = [f"process {p} at {lb!r}" for p, (n, lb) in where.items() if n < pr["count"]]
    ahead = [f"process {p} reached {lb!r}" for p, (n, lb) in where.items() if n > pr["count"]]
    head = (
        f"process {me} made no progress for {now - pr['since']:.0f} s at {pr['label']!r} "
        f"(--dist_step_timeout_s={step_timeout_s:g}): "
    )
    if behind:
        return head + ", ".join(behind) + " did not get here (hung)"
    if ahead:
        return head + "this process is the one behind (" + ", ".join(ahead) + ")"
    return head + "every process is at the same point (a hung collective or sandbox)"


def _client():
    from jax._src import distributed as jd  # the coordination-service client (orbax uses it the same way)

    return jd.global_state.client


@dataclasses.dataclass
class Context:
    """This process's place in the run, and the host-side operations every process calls together."""

    index: int = 0
    count: int = 1
    step_timeout_s: int = 1800
    _seq: int = 0
    _mine: list = dataclasses.field(default_factory=list)

    @property
    def is_main(self) -> bool:
        return self.index == 0

    @property
    def multi(self) -> bool:
        return self.count > 1

    def _key(self, name: str) -> str:
        self._seq += 1
        return f"grpo_jax/{self._seq}/{name}"

    def allgather_objects(self, name: str, obj: Any, timeout_s: float | None = None) -> list[Any]:
        """[obj of process 0, obj of process 1, ...]: every process calls it with its own picklable `obj`
        (the same `name` sequence everywhere). Single process: [obj]."""
        if not self.multi:
            return [obj]
        client, key = _client(), self._key(name)
        client.key_value_set(f"{key}/{self.index}", base64.b64encode(pickle.dumps(obj)).decode())
        ms = int(1000 * (timeout_s or self.step_timeout_s))
        out = []
        for p in range(self.count):
            try:
                raw = client.blocking_key_value_get(f"{key}/{p}", ms)
            except Exception as e:
                raise PeerLost(
                    f"process {p} of {self.count} did not deliver {name!r} within {ms / 1000:.0f} s "
                    f"(--dist_step_timeout_s): it is hung or dead ({str(e).splitlines()[0][:200]})"
                ) from None
            out.append(pickle.loads(base64.b64decode(raw)))
        # every process has read our key of the exchange before this one (it wrote this one's key after it
        # finished reading that one, and we just read them all): it can go, so the store stays small
        self._mine.append(f"{key}/{self.index}")
        if len(self._mine) > 1:
            try:
                client.key_value_delete(self._mine.pop(0))
            except Exception:  # deleting is housekeeping; a failure here is not the run's failure
                pass
        return out

    def broadcast_object(self, name: str, fn) -> Any:
        """fn() computed on process 0 only, its (picklable) result returned on every process."""
        if not self.multi:
            return fn()
        value = fn() if self.is_main else None
        return self.allgather_objects(name, value)[0]

    def progress(self, label: str) -> None:
        """Mark a point of the GRPO step reached (the watchdog ends a step that stops making progress)."""
        _PROGRESS.update(
            {"armed": True, "count": _PROGRESS["count"] + 1, "label": label, "since": time.monotonic()}
        )

    def idle(self) -> None:
        """Outside the GRPO steps (SFT, evaluation, checkpoints): no progress deadline."""
        _PROGRESS.update({"armed": False, "since": time.monotonic()})

    def barrier(self, name: str, timeout_s: float | None = None) -> None:
        """Wait until every process arrives; PeerLost naming the missing ones after the timeout."""
        if not self.multi:
            return
        key = self._key(name)
        ms = int(1000 * (timeout_s or self.step_timeout_s))
        try:
            _client().wait_at_barrier(key, ms)
        except Exception as e:
            msg = str(e).splitlines()[0][:400]
            raise PeerLost(
                f"barrier {name!r}: not every process of {self.count} arrived within {ms / 1000:.0f} s "
                f"(--dist_step_timeout_s); a process is hung or dead: {msg}"
            ) from None

    def host(self, x: Any) -> Any:
        """A device tree as numpy on this process (grpo_jax.runtime.sharding.to_host; collective)."""
        from grpo_jax.runtime.sharding import to_host

        return to_host(x)

    def print_fn(self, fn=print):
        """`fn` on process 0; other processes print nothing (their errors still reach stderr)."""
        if self.is_main:
            return fn
        return lambda *a, **k: None


def fail_after_error(e: BaseException, heartbeat_s: float) -> None:
    """An error in a multi-process run (often a collective failing because a peer died): print it, give the
    watchdog one heartbeat timeout to find a lost peer (it then ends the process naming it), else end this
    process with status 1. os._exit either way: a normal exit would wait for the lost peer at JAX's
    shutdown barrier."""
    import os
    import traceback

    traceback.print_exception(e, file=sys.stderr)
    first = str(e).splitlines()[0][:300] if str(e) else ""
    print(
        f"error in process {jax.process_index()}: {type(e).__name__}: {first}; waiting up to "
        f"{heartbeat_s + 3:g} s to see whether another process was lost",
        file=sys.stderr,
        flush=True,
    )
    time.sleep(heartbeat_s + 3)
    print(
        f"error: process {jax.process_index()} failed on its own (no other process was lost)", file=sys.stderr
    )
    sys.stderr.flush()
    os._exit(1)


def context(dist=None) -> Context:
    timeout = 1800 if dist is None else dist.step_timeout_s
    return Context(index=jax.process_index(), count=jax.process_count(), step_timeout_s=timeout)


EXIT_PEER_LOST = 75  # EX_TEMPFAIL: rerun the same command to resume from the last checkpoint


def fail_lost(e: PeerLost) -> None:
    """End this process after a lost peer: the message on stderr, exit status EXIT_PEER_LOST. os._exit,
    because the main thread may be blocked in a collective with the lost process, and JAX's runtime would
    wait for it at shutdown."""
    import os

    print(
        f"error: {e}; ending process {jax.process_index()} (exit {EXIT_PEER_LOST}); rerun the same command "
        "to resume from the last checkpoint",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_PEER_LOST)
