"""Memory and pids limits per executor slot with cgroups, where the kernel and privileges allow.

cgroup v2 first: a group under this process's own v2 group, with the `memory` and `pids` controllers
delegated to it (`memory.max`, `memory.swap.max = 0`, `pids.max`). Where v2 lacks those controllers (a hybrid
host binds them to v1) or cannot delegate them, cgroup v1: a group in this process's own `memory` and `pids`
hierarchies (`memory.limit_in_bytes`, `memory.memsw.limit_in_bytes` when swap is accounted, `pids.max`).
Otherwise nothing, said so in the report: the RLIMIT_AS / RLIMIT_NPROC limits of every program stay
either way.

A slot's zygote joins its group itself, before it forks anything (`_zygote.main`), so every program and every
process a program forks is inside. The whole slot shares the group: the limit is the program's memory limit
plus a fixed headroom for the zygote's own two processes. The zygote sets its own `oom_score_adj` to -1000
(root only) and each program's to 1000, so an out-of-memory kill inside the group takes the program.
`oom_kills()` lets the executor turn such a kill into a `memory` verdict.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

HEADROOM_BYTES = 256 << 20  # the slot's zygote processes and the program's tmpfs work dir share the group
EXTRA_PIDS = 8  # the zygote's own processes
_SEQ = itertools.count()  # several executors in one process get groups of their own


def _group_name() -> str:
    return f"grpo_jax_sandbox_{os.getpid()}_{next(_SEQ)}"


def _mounts() -> list[tuple[str, str, str]]:
    """[(mount point, fstype, super options)] from /proc/self/mountinfo."""
    out = []
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 3:
                out.append((fields[4].replace("\\040", " "), rest[0], rest[2]))
    except OSError:
        pass
    return out


def _own_paths() -> dict[str, str]:
    """{controller or "" for v2: this process's group path} from /proc/self/cgroup."""
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    except (OSError, ValueError):
        pass
    return out


def _sweep_stale(base: Path) -> int:
    """Remove the groups an executor left under `base` when its process was killed (SIGKILL cannot clean
    up): `grpo_jax_sandbox_<pid>_<n>` whose pid is gone. Only empty groups can be removed.
    Returns how many were removed."""
    removed = 0
    try:
        entries = list(base.iterdir())
    except OSError:
        return 0
    for d in entries:
        parts = d.name.split("_")
        if not d.name.startswith("grpo_jax_sandbox_") or len(parts) != 5 or not parts[3].isdigit():
            continue
        if int(parts[3]) == os.getpid() or Path(f"/proc/{parts[3]}").exists():
            continue
        try:
            for child in d.iterdir():
                if child.is_dir():
                    os.rmdir(child)
            os.rmdir(d)
            removed += 1
        except OSError:
            pass
    return removed


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class SlotCgroups:
    """The groups of every slot of one executor: `setup(n, memory, pids)`, `procs_files(i)`, `set_memory`,
    `oom_kills(i)`, `close()`. `report` says what is in force and, when nothing is, why."""

    def __init__(self) -> None:
        self.version: str | None = None
        self.report: dict = {
            "active": False,
            "version": None,
            "why": "",
            "memory_bytes": 0,
            "pids": 0,
            "group": "",
        }
        self._slots: list[dict[str, Path]] = []
        self._roots: list[Path] = []

    # ---------------------------------------------------------------------------------------------- setup
    def setup(self, n: int, memory_bytes: int, pids: int) -> None:
        if os.geteuid() != 0:
            self.report["why"] = "not root: no cgroup can be created for the slots"
            return
        mem, npids = int(memory_bytes) + HEADROOM_BYTES, int(pids) + EXTRA_PIDS
        why2 = self._try_v2(n, mem, npids)
        if self.version is None:
            why1 = self._try_v1(n, mem, npids)
            if self.version is None:
                self.report["why"] = f"cgroup v2: {why2}; cgroup v1: {why1}"
                self.close()
                return
            self.report["v2_unavailable"] = why2
        self.report.update(active=True, version=self.version, memory_bytes=mem, pids=npids)

    def _try_v2(self, n: int, mem: int, npids: int) -> str:
        mounts = [m for m in _mounts() if m[1] == "cgroup2"]
        own = _own_paths().get("")
        if not mounts or own is None:
            return "no cgroup2 mount"
        base = Path(mounts[0][0] + own.rstrip("/"))
        try:
            have = set((base / "cgroup.controllers").read_text().split())
        except OSError as e:
            return f"cannot read {base}/cgroup.controllers ({e.strerror})"
        lacking = {"memory", "pids"} - have
        if lacking:
            return f"the memory and pids controllers are not available in {base} (missing {sorted(lacking)})"
        _sweep_stale(base)
        root = base / _group_name()
        self.report["group"] = root.name
        try:
            os.mkdir(root)
            self._roots.append(root)
            _write(root / "cgroup.subtree_control", "+memory +pids")
            for i in range(n):
                d = root / f"slot{i}"
                os.mkdir(d)
                _write(d / "memory.max", str(mem))
                if (d / "memory.swap.max").exists():
                    _write(d / "memory.swap.max", "0")
                _write(d / "pids.max", str(npids))
                self._slots.append({"procs": d / "cgroup.procs", "memory": d / "memory.max", "events": d})
        except OSError as e:
            self.close()
            return f"cannot delegate memory and pids under {base} ({e.strerror})"
        self.version = "v2"
        return ""

    def _try_v1(self, n: int, mem: int, npids: int) -> str:
        own = _own_paths()
        bases = {}
        for point, fstype, opts in _mounts():
            if fstype == "cgroup":
                for c in ("memory", "pids"):
                    if c in opts.split(",") and c in own:
                        bases[c] = Path(point + own[c].rstrip("/"))
        lacking = {"memory", "pids"} - set(bases)
        if lacking:
            return f"no v1 hierarchy for {sorted(lacking)}"
        for b in bases.values():
            _sweep_stale(b)
        try:
            name = _group_name()
            self.report["group"] = name
            roots = {c: b / name for c, b in bases.items()}
            for r in roots.values():
                os.mkdir(r)
                self._roots.append(r)
            for i in range(n):
                dm, dp = roots["memory"] / f"slot{i}", roots["pids"] / f"slot{i}"
                os.mkdir(dm)
                os.mkdir(dp)
                _write(dm / "memory.limit_in_bytes", str(mem))
                if (dm / "memory.memsw.limit_in_bytes").exists():
                    _write(dm / "memory.memsw.limit_in_bytes", str(mem))
                _write(dp / "pids.max", str(npids))
                self._slots.append(
                    {"procs": dm / "cgroup.procs", "procs2": dp / "cgroup.procs", "memory": dm, "events": dm}
                )
        except OSError as e:
            self.close()
            return f"cannot create groups under {bases} ({e.strerror})"
        self.version = "v1"
        return ""

    # -------------------------------------------------------------------------------------------- per slot
    def procs_files(self, i: int) -> list[str]:
        """The cgroup.procs files slot i's zygote writes its pid into ([] without cgroups)."""
        if self.version is None or i >= len(self._slots):
            return []
        s = self._slots[i]
        return [str(s["procs"])] + ([str(s["procs2"])] if "procs2" in s else [])

    def set_memory(self, i: int, memory_bytes: int) -> None:
        """Per-job memory limits: the group follows the job's limit (plus the headroom)."""
        if self.version is None or i >= len(self._slots):
            return
        mem = str(int(memory_bytes) + HEADROOM_BYTES)
        try:
            if self.version == "v2":
                _write(self._slots[i]["memory"], mem)
            else:
                d = self._slots[i]["memory"]
                if (d / "memory.memsw.limit_in_bytes").exists():  # memsw >= mem at all times: order matters
                    cur = int((d / "memory.limit_in_bytes").read_text())
                    first = ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
                    for name in first if int(mem) > cur else first[::-1]:
                        _write(d / name, mem)
                else:
                    _write(d / "memory.limit_in_bytes", mem)
        except (OSError, ValueError):
            pass

    def oom_kills(self, i: int) -> int:
        """How many processes the kernel's OOM killer has killed in slot i's group so far (-1: unknown)."""
        if self.version is None or i >= len(self._slots):
            return -1
        d = self._slots[i]["events"]
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            for line in (d / name).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError):
            pass
        return -1

    def close(self) -> None:
        """Remove the groups (children first); a group that still has processes stays and is reported."""
        left = []
        for s in reversed(self._slots):
            for key in ("procs", "procs2"):
                if key in s:
                    try:
                        os.rmdir(Path(s[key]).parent)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        left.append(str(Path(s[key]).parent))
        for r in reversed(self._roots):
            try:
                os.rmdir(r)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(str(r))
        self._slots, self._roots = [], []
        if left:
            self.report["left_behind"] = left
