"""Which isolation tier this machine allows, how a slot is configured for it, and the honest report.

Tiers (strongest first):

* ``namespaces+uid+seccomp`` (root): per slot a private mount/net/uts/pid namespace, pivoted into a read-only
  minimal root (/usr, /etc, a few devices; no /home, /root, /work, project or data directories), no network
  (its own ``lo``, down); per program a fresh size-capped tmpfs work dir and IPC namespace, rlimits, a
  dedicated unprivileged uid per slot (so RLIMIT_NPROC works), no_new_privs and a seccomp denylist; the
  slot's pid 1 kills every other process of its namespace after each program.
  ``namespaces+uid`` if seccomp cannot load.
* ``userns+rlimits`` (not root, unprivileged user namespaces allowed): the same namespaces from inside a user
  namespace, all capabilities dropped, rlimits; no per-slot uid, so RLIMIT_NPROC is a coarse cap over all of
  the user's processes. ``userns+seccomp+rlimits`` when the filter loads.
* ``rlimits-only``: a plain fork with rlimits, a new session and a temporary work dir. No filesystem or
  network isolation; a double-forked ``setsid`` daemon can escape the tree kill. ``seccomp+rlimits`` when the
  filter loads.

The executor measures the tier from inside a sandboxed probe child and reports what it observed; it never
claims a protection that the probe did not see.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

SANDBOX_PYTHON = "/usr/bin/python3"
UID_BASE = 61000
UID_COUNT = 1000
LOCK_DIR = "/run/grpo_jax_sandbox"

MODES = ("root", "userns", "rlimits")
_REQUEST_ALIASES = {
    "auto": None,
    "namespaces+uid+seccomp": "root",
    "namespaces+uid": "root",
    "namespaces": "root",
    "root": "root",
    "userns": "userns",
    "userns+rlimits": "userns",
    "userns+seccomp+rlimits": "userns",
    "rlimits-only": "rlimits",
    "seccomp+rlimits": "rlimits",
    "rlimits": "rlimits",
}


def zygote_source() -> str:
    return (Path(__file__).with_name("_zygote.py")).read_text()


def sandbox_python() -> str:
    return SANDBOX_PYTHON if os.access(SANDBOX_PYTHON, os.X_OK) else ""


def userns_possible() -> bool:
    try:
        if Path("/proc/sys/kernel/unprivileged_userns_clone").read_text().strip() == "0":
            return False
    except OSError:
        pass
    try:
        return int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        return False


def candidate_modes(requested: str) -> list[str]:
    """The modes to try, strongest first, for a requested tier ("auto" or a tier name)."""
    if requested not in _REQUEST_ALIASES:
        raise ValueError(f"unknown tier {requested!r}; valid: {sorted(_REQUEST_ALIASES)}")
    want = _REQUEST_ALIASES[requested]
    if want is not None:
        return [want]
    modes = []
    if os.geteuid() == 0:
        modes.append("root")
    elif userns_possible():
        modes.append("userns")
    modes.append("rlimits")
    return modes


def tier_name(mode: str, seccomp: bool) -> str:
    if mode == "root":
        return "namespaces+uid+seccomp" if seccomp else "namespaces+uid"
    if mode == "userns":
        return "userns+seccomp+rlimits" if seccomp else "userns+rlimits"
    return "seccomp+rlimits" if seccomp else "rlimits-only"


def sandbox_uid_pids() -> list[int]:
    """The pids of every process of a sandbox uid on this machine (visible from the host's /proc); [] after
    every program when nothing escaped the tree kill."""
    out = []
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                uid = os.stat(f"/proc/{n}").st_uid
            except OSError:
                continue
            if UID_BASE <= uid < UID_BASE + UID_COUNT:
                out.append(int(n))
    return out


def uid_leased(uid: int) -> bool:
    """Whether a live executor holds `uid`'s lease (`UidLease`: an flock, released when its holder exits)."""
    try:
        fd = os.open(f"{LOCK_DIR}/uid-{uid}.lock", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def stray_sandbox_pids(own_uids=()) -> list[int]:
    """The sandbox-uid processes that outlived their program: those of `own_uids` (a live executor's slots,
    between its batches) and those of every uid that no live executor holds (left by an executor that is
    gone). Programs that other executors on the machine are running right now are not strays."""
    own = set(own_uids)
    out = []
    for pid in sandbox_uid_pids():
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if uid in own or not uid_leased(uid):
            out.append(pid)
    return out


class UidLease:
    """Exclusive per-slot uids across every executor on the machine (flock on /run files; root only)."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def acquire(self) -> int:
        os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            if uid in self._fds:
                continue
            fd = os.open(f"{LOCK_DIR}/uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._fds[uid] = fd
            return uid
        raise RuntimeError("no free sandbox uid")

    @property
    def uids(self) -> tuple[int, ...]:
        """The uids this lease holds."""
        return tuple(self._fds)

    def release_all(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()


PROBE_PROGRAM = r"""
import os, socket
def _facts():
    d = {"uid": os.getuid(), "euid": os.geteuid(), "pid": os.getpid()}
    d["root_entries"] = sorted(os.listdir("/"))
    try:
        d["visible_pids"] = len([x for x in os.listdir("/proc") if x.isdigit()])
    except OSError:
        d["visible_pids"] = -1
    st = {}
    for line in open("/proc/self/status").read().splitlines():
        k, _, v = line.partition(":")
        if k in ("Seccomp", "NoNewPrivs", "CapEff"):
            st[k] = v.strip()
    d["status"] = st
    try:
        lines = open("/proc/net/dev").read().splitlines()[2:]
        d["net_ifaces"] = sorted(l.split(":")[0].strip() for l in lines if l)
    except OSError:
        d["net_ifaces"] = ["?"]
    s = None
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(0.5)
        s.connect(("127.0.0.1", 9))
        d["loopback"] = "connected"
    except OSError as e:
        d["loopback"] = type(e).__name__ + ":" + str(e.errno)
    finally:
        if s is not None:
            s.close()
    d["env"] = sorted(os.environ)
    d["home_visible"] = any(os.path.exists(p) for p in ("/root", "/home", "/work"))
    try:
        d["cgroup"] = open("/proc/self/cgroup").read()[:4000]
    except OSError:
        d["cgroup"] = ""
    return d
"""


def report_from_probe(
    mode: str, seccomp_loaded: bool, facts: dict | None, errors: dict, cgroup: dict | None = None
) -> dict:
    """Build the tier report from what the probe child observed. Each protection is True only if seen (the
    slot's cgroups count only when the probe child finds itself inside the group `cgroup["group"]`)."""
    f = facts or {}
    cg = cgroup or {}
    in_group = bool(cg.get("active")) and bool(cg.get("group")) and cg["group"] in str(f.get("cgroup", ""))
    st = f.get("status", {}) if isinstance(f.get("status"), dict) else {}
    ifaces = f.get("net_ifaces") if isinstance(f.get("net_ifaces"), list) else ["?"]
    uid = f.get("uid")
    active = {
        "pid_namespace": mode != "rlimits" and f.get("pid") == 2,
        "mount_namespace_minimal_root": mode != "rlimits" and f.get("home_visible") is False,
        "network_namespace": mode != "rlimits" and ifaces == ["lo"],
        "no_loopback": f.get("loopback", "connected") != "connected",
        "unprivileged_uid_per_slot": mode == "root" and isinstance(uid, int) and uid >= UID_BASE,
        # in userns mode the child is uid 0 of its namespace, mapped to the executor's own (non-root) uid
        "non_root": (isinstance(uid, int) and uid != 0)
        or (mode == "userns" and os.geteuid() != 0 and st.get("CapEff", "1").strip("0") == ""),
        "seccomp": seccomp_loaded and st.get("Seccomp") == "2",
        "no_new_privs": st.get("NoNewPrivs") == "1",
        "rlimits": facts is not None,
        "nproc_limit_effective": mode in ("root",),
        "cleared_env": set(f.get("env") or ["?"]) <= {"PATH", "LANG", "HOME", "TMPDIR"},
        "private_workdir": facts is not None,
        "cgroup_memory_pids": in_group,
    }
    missing = {}
    why = {
        "pid_namespace": "needs root or an unprivileged user namespace",
        "mount_namespace_minimal_root": "needs root or an unprivileged user namespace",
        "network_namespace": "needs root or an unprivileged user namespace",
        "unprivileged_uid_per_slot": "needs root (setuid to a dedicated uid per slot)",
        "seccomp": "libseccomp.so.2 could not be loaded or the filter did not apply",
        "nproc_limit_effective": "RLIMIT_NPROC counts per real uid: exact only with a dedicated uid per slot",
        "cgroup_memory_pids": (cg.get("why") or "the probe child is not inside the slot's group")
        + "; the aggregate memory of a multi-process program is bounded only by RLIMIT_AS x RLIMIT_NPROC",
    }
    for k, v in active.items():
        if not v:
            missing[k] = why.get(k, "not observed by the probe")
    return {
        "tier": tier_name(mode, active["seccomp"]),
        "mode": mode,
        "active": active,
        "missing": missing,
        "errors": errors,
        "probe": f,
    }
