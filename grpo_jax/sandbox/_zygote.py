"""Fork-server ("zygote") for one executor slot. Stdlib only; never imports grpo_jax or jax.

Started by the executor as ``/usr/bin/python3 -I -S -c <this file's text> <config-json>`` (the source is
passed with -c so that no project path has to be readable by anyone). It speaks length-prefixed frames on the
fds it got as stdin (requests) and stdout (responses). Namespace modes ("root", "userns"):

    outer (the Popen'd process): private mount/net/uts namespaces (+ a user namespace in "userns" mode),
      │   pivot_root into a minimal read-only root; then unshare(NEWPID) and fork; waits for S
      └─ S  pid 1 of the slot's own pid namespace (PDEATHSIG=KILL), mounts its /proc; serves requests:
          per program: a fresh size-capped tmpfs on /tmp, fork C, enforce wall/output/result caps, then
          kill(-1, SIGKILL) from pid 1 (only reaches this namespace) until no other process is left
          └─ C  unshare(NEWIPC), rlimits, setgroups/setgid/setuid(slot uid) (root mode) or all capabilities
                dropped (userns mode), no_new_privs, seccomp, cleared env, stdin=/dev/null,
                stdout+stderr -> output pipe, fd 3 -> result pipe; reads its job (program, setup, calls)
                from the request's payload memfd and runs the harness (program, calls, check)
                └─ P  only for a job with a child check: C forks the program's process P before it reads the
                      check text (fd 4); P runs the program and answers C's calls with plain data, C runs
                      the check. P has no result fd, never holds the check, and cannot read C (not dumpable).

A request is a small JSON header (id, limits, flags and the sizes of what follows: never any of the job's
text), then the payload (the program, setup code and test calls as JSON), the check text and a stdio test's
input, each spliced from the request pipe into its own sealed memfd: the job's text never enters S's memory
(every later child is a copy of S: no later program can find an earlier one's source, calls or check there).
C parses the payload, after the fork, in its own memory.

A stdin/stdout test ("stdio" request, one per test) is the same C with fd 0 = the sealed memfd holding that
test's input, fd 1 = its own stdout pipe (returned in full, up to the output cap, as a 4th response part) and
fd 2 = the output pipe; the harness runs the program as `__main__` as `python3 prog.py` would. A file-I/O
test (header "input_file" / "output_file", plain names): C copies the input memfd into that file of the work
dir before the program runs and gives it /dev/null as stdin (`_place_input`); after the program's tree is
gone S opens the output file (no symlink, regular files only: `_open_output`) and sends it, with sendfile,
as the 4th part instead of the stdout.

In the "rlimits" mode there are no namespaces: the zygote forks C directly (new session, temporary work dir),
and the tree kill is best effort (process group + session sweep).

Everything the child sends back is raw bytes (size-capped here); the parent parses and grades them.
"""

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
import types

# Warm the stdlib the programs commonly import, so the forked children get them for free.
for _m in (
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "typing",
    "random",
    "operator",
    "copy",
    "fractions",
    "decimal",
    "statistics",
    "datetime",
    "dataclasses",
    "traceback",
    "io",
    "hashlib",
    "enum",
    "threading",
    "unittest",
):
    try:
        __import__(_m)
    except Exception:  # pragma: no cover - a missing optional module is fine
        pass

import traceback  # noqa: E402

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWCGROUP = 0x02000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_DUMPABLE = 4
RESULT_FD = 3
CHECK_FD = 4  # C: the check text (read once P is forked); P: the checker's requests
# framing sanity bounds (the executor enforces the real limits: Limits.source_bytes, .stdin_bytes, ...)
MAX_HEADER = 1 << 16  # the request header: limits, sizes, flags (never any of the job's text)
MAX_PAYLOAD = 1 << 30  # the program, setup code and test calls (JSON)
MAX_CHECK = 1 << 20
MAX_STDIN = 1 << 30

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.syscall.restype = ctypes.c_long


def _check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(src, target, fstype, flags, data=None):
    _check(
        _libc.mount(
            src.encode() if src else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _prctl(opt, a=0, b=0, c=0, d=0):
    _check(_libc.prctl(opt, a, b, c, d), f"prctl {opt}")


def _unshare(flags):
    _check(_libc.unshare(flags), f"unshare {flags:#x}")


# ---------------------------------------------------------------------------------------------------------
# seccomp (libseccomp via ctypes); the filter is built once here and loaded in every child
# ---------------------------------------------------------------------------------------------------------
class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


DENY_SYSCALLS = (
    "ptrace process_vm_readv process_vm_writev mount umount2 unshare setns pivot_root chroot bpf "
    "perf_event_open keyctl add_key request_key io_uring_setup io_uring_enter io_uring_register kexec_load "
    "kexec_file_load reboot swapon swapoff init_module finit_module delete_module userfaultfd "
    "open_by_handle_at name_to_handle_at acct quotactl lookup_dcookie fanotify_init syslog fsopen fsmount "
    "fsconfig move_mount open_tree fspick mount_setattr pidfd_getfd kcmp add_key vhangup"
).split()
NS_FLAGS = (
    CLONE_NEWNS,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
    CLONE_NEWCGROUP,
)


class Seccomp:
    def __init__(self):
        name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
        lib = ctypes.CDLL(name, use_errno=True)
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_ArgCmp),
        ]
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        self.lib = lib
        allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
        ctx = lib.seccomp_init(allow)
        if not ctx:
            raise OSError("seccomp_init failed")
        self.ctx = ctx
        self.denied = []

        def add(name, action, cmps=()):
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # unknown on this arch/libseccomp: nothing to deny
                return
            arr = (_ArgCmp * max(1, len(cmps)))(*[_ArgCmp(*c) for c in cmps])
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
            if rc != 0:
                raise OSError(-rc, f"seccomp_rule_add {name}")
            self.denied.append(name)

        for name in DENY_SYSCALLS:
            add(name, eperm)
        add("clone3", enosys)  # glibc falls back to clone(2), whose flags we can inspect
        for bit in NS_FLAGS:
            add("clone", eperm, [(0, 7, bit, bit)])  # SCMP_CMP_MASKED_EQ: flags & bit == bit
        add("socket", eperm, [(0, 1, 1, 0)])  # SCMP_CMP_NE AF_UNIX: only unix sockets

    def load(self):
        rc = self.lib.seccomp_load(self.ctx)
        if rc != 0:
            raise OSError(-rc, "seccomp_load")


# ---------------------------------------------------------------------------------------------------------
# The minimal root (namespace modes)
# ---------------------------------------------------------------------------------------------------------
def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def build_root(userns):
    """Enter private mount/net/uts namespaces and pivot into a read-only root with /usr, /etc and a few
    devices; there is no /home, /root, /work, /var, /sys or host /tmp in it."""
    if userns:
        uid, gid = os.getuid(), os.getgid()
        _unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUTS)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    else:
        _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUTS)
    try:
        import socket

        socket.sethostname("sandbox")
    except Exception:
        pass
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # The new root is a small tmpfs mounted over /tmp inside our private mount namespace (the host's /tmp is
    # untouched and nothing is left behind on the host).
    root = "/tmp"
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=256,mode=0755")
    ro = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV

    def bind_ro(src, dst):
        _mount(src, dst, None, MS_BIND | MS_REC)
        try:
            _mount(None, dst, None, ro)
        except OSError:
            if not userns:
                raise
            _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY)

    for d in ("usr", "etc"):
        os.mkdir(f"{root}/{d}")
        bind_ro(f"/{d}", f"{root}/{d}")
    for d in ("bin", "lib", "lib64", "sbin", "lib32", "libx32"):
        if os.path.islink(f"/{d}"):
            os.symlink(os.readlink(f"/{d}"), f"{root}/{d}")
        elif os.path.isdir(f"/{d}"):
            os.mkdir(f"{root}/{d}")
            bind_ro(f"/{d}", f"{root}/{d}")
    os.mkdir(f"{root}/dev")
    for dev in ("null", "zero", "full", "random", "urandom"):
        open(f"{root}/dev/{dev}", "w").close()
        _mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, MS_BIND)
    os.symlink("/proc/self/fd", f"{root}/dev/fd")
    for i, n in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{root}/dev/{n}")
    os.symlink("/tmp", f"{root}/dev/shm")
    os.mkdir(f"{root}/proc")
    if userns:  # a fresh proc needs a fully visible one in the mount ns; the child mounts over it
        _mount("/proc", f"{root}/proc", None, MS_BIND | MS_REC)
    else:
        _mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(f"{root}/tmp", 0o755)
    os.mkdir(f"{root}/.old")
    _check(_libc.syscall(155, root.encode(), f"{root}/.old".encode()), "pivot_root")  # SYS_pivot_root
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=256,mode=0755")


# ---------------------------------------------------------------------------------------------------------
# The harness that runs inside the sandboxed child (C3). Untrusted code shares this interpreter: nothing here
# is a security boundary, it only produces plain data for the parent to judge.
# ---------------------------------------------------------------------------------------------------------
_dumps = json.dumps
_perf = time.perf_counter
_write_fd = os.write
_exit = os._exit
_compile = compile
_type = type
_len = len
# the harness must not depend on names the program can rebind (builtins.isinstance = ..., etc.)
_isinstance = isinstance
_enumerate = enumerate
_str = str
_abs = abs
_hex = hex
_exec = exec
_eval = eval
_BaseException = BaseException
_ModuleType = types.ModuleType
_sys_modules = sys.modules
_list = list
_loads = json.loads
MAX_DEPTH = 100


def _tag(v, depth=0):
    """Plain data only. Instances of subclasses of the builtin types (Counter, defaultdict, namedtuple, or an
    int subclass with a rigged __eq__) are reduced to their underlying builtin data through the base class's
    own methods, so nothing the program overrides is consulted; the parent then compares plain values."""
    if depth > MAX_DEPTH:
        raise ValueError("result nested too deeply")
    t = _type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return {"i": _hex(v)} if _abs(v) > (1 << 53) else {"i": v}
    if t is float:
        return {"f": float.__repr__(v)}
    if t is list:
        return {"l": [_tag(x, depth + 1) for x in v]}
    if t is tuple:
        return {"t": [_tag(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[_tag(k, depth + 1), _tag(x, depth + 1)] for k, x in v.items()]}
    if t is set:
        return {"s": [_tag(x, depth + 1) for x in v]}
    if t is frozenset:
        return {"fs": [_tag(x, depth + 1) for x in v]}
    if t is bytes:
        return {"b": v.hex()}
    if t is complex:
        return {"c": [float.__repr__(v.real), float.__repr__(v.imag)]}
    if t is _Remote:
        return {"ref": v._rid}
    # subclasses of builtins: take the base data with the base class's methods
    if _isinstance(v, int):  # bool cannot be subclassed
        return _tag(int.__index__(v), depth)
    if _isinstance(v, float):
        return _tag(float.__float__(v), depth)
    if _isinstance(v, str):
        return str.__str__(v)
    if _isinstance(v, dict):
        return {"d": [[_tag(k, depth + 1), _tag(x, depth + 1)] for k, x in dict.items(v)]}
    if _isinstance(v, tuple):
        return {"t": [_tag(x, depth + 1) for x in tuple.__iter__(v)]}
    if _isinstance(v, list):
        return {"l": [_tag(x, depth + 1) for x in list.__iter__(v)]}
    if _isinstance(v, frozenset):
        return {"fs": [_tag(x, depth + 1) for x in frozenset.__iter__(v)]}
    if _isinstance(v, set):
        return {"s": [_tag(x, depth + 1) for x in set.__iter__(v)]}
    raise TypeError(f"unsupported result type {t.__name__}")


def _emit(rec):
    data = (_dumps(rec) + "\n").encode("utf-8", "surrogatepass")
    while data:
        n = _write_fd(RESULT_FD, data)
        data = data[n:]


def _short(e):
    try:
        msg = _str(e)
    except _BaseException:
        msg = "<unprintable>"
    return _type(e).__name__, msg[:300]


def harness(req):
    """Run setup + program, then each test call independently; with a child check, split into the program's
    process and the checker first (`_checker`); a stdio request runs the program as a script (`_stdio_side`).
    Never returns."""
    if req.get("stdio"):
        _stdio_side(req)
    if req.get("check_len"):
        _checker(req)
    _program_side(req, serve=False)


class _Quitter:
    """`exit` / `quit` as `site` defines them (the sandbox's interpreter runs with -S: no site)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        try:  # site.Quitter closes stdin first
            sys.stdin.close()
        except _BaseException:
            pass
        raise SystemExit(code)


def _exit_status(e):
    """The exit status `python3 prog.py` gives a SystemExit (pythonrun.c handle_system_exit): None -> 0, an
    int -> that int (the OS keeps its low 8 bits), anything else is printed to stderr -> 1."""
    code = e.code
    if code is None:
        return 0
    if _isinstance(code, int):
        try:
            return int.__index__(code) & 0xFF
        except _BaseException:
            return 1
    try:
        sys.stderr.write(_str(code) + "\n")
    except _BaseException:
        pass
    return 1


def _stdio_side(req):
    """A stdin/stdout test: the program as `__main__` reading fd 0 (its own test's input only) and writing fd
    1, ended the way the interpreter ends a script: SystemExit -> its status, an uncaught exception -> its
    traceback on stderr and status 1, then non-daemon threads are joined, atexit handlers run and the
    standard streams flushed (threading._shutdown, atexit, flush_std_files in Py_FinalizeEx). The exit
    status is the verdict's input, read by the zygote (never a record); records only say "syntax", "start"
    and the uncaught exception's type. Never returns."""
    out, err = sys.stdout, sys.stderr
    rc = 1
    try:
        import atexit
        import builtins

        builtins.exit = _Quitter("exit")
        builtins.quit = _Quitter("quit")
        mod = _ModuleType("__main__")
        mod.__dict__["__builtins__"] = builtins
        _sys_modules["__main__"] = mod
        sys.argv = ["solution.py"]
        try:
            code = _compile(req["program"], "solution.py", "exec")
        except _BaseException as e:
            et, msg = _short(e)
            _emit({"k": "syntax", "exc": et, "msg": msg})
            _flush_exit(0)
        _emit({"k": "start"})
        try:
            _exec(code, mod.__dict__)
            rc = 0
        except SystemExit as e:
            rc = _exit_status(e)
        except _BaseException as e:
            et, msg = _short(e)
            _emit({"k": "exc", "exc": et, "msg": msg})
            rc = 1
            try:  # the traceback python3 prints, from the program's frames (not this harness's)
                tb = e.__traceback__
                traceback.print_exception(_type(e), e, tb.tb_next if tb is not None else None, file=err)
            except _BaseException:
                pass
        try:  # as Py_FinalizeEx's wait_for_thread_shutdown: only if the program's threading is imported
            th = _sys_modules.get("threading")
            if th is not None:
                th._shutdown()
        except _BaseException:
            pass
        try:
            atexit._run_exitfuncs()
        except _BaseException:
            pass
        for s in (sys.stdout, sys.stderr, out, err):
            try:
                s.flush()
            except _BaseException:
                rc = rc or 120  # Py_FinalizeEx: a failed flush of stdout gives 120
    except _BaseException:
        pass
    _exit(rc)


def _program_side(req, serve):
    try:
        mod = _ModuleType("__main__")
        mod.__dict__["__builtins__"] = __builtins__
        _sys_modules["__main__"] = mod
        g = mod.__dict__
        sys.argv = ["solution.py"]
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
        try:
            code_setup = _compile(req.get("setup") or "", "<setup>", "exec")
            code_prog = _compile(req["program"], "solution.py", "exec")
        except _BaseException as e:  # SyntaxError, ValueError (null bytes), UnicodeEncodeError, MemoryError
            et, msg = _short(e)
            _emit({"k": "syntax", "exc": et, "msg": msg})
            _flush_exit(0)
        calls = []
        for i, call in _enumerate(req.get("calls") or ()):
            try:
                calls.append(_compile(call, f"<test {i}>", "eval"))
            except _BaseException as e:
                calls.append(e)
        try:
            _exec(code_prog, g)
            _exec(code_setup, g)  # MBPP's test_setup_code uses names the program defines
        except _BaseException as e:
            et, msg = _short(e)
            _emit({"k": "prog_err", "exc": et, "msg": msg})
            _flush_exit(0)
        _emit({"k": "start"})
        stop = req.get("stop") is True  # Job.stop_on_failure: no call after the first one that fails here
        for i, c in _enumerate(calls):
            t0 = _perf()
            if _isinstance(c, _BaseException):
                et, msg = _short(c)
                _emit({"k": "t", "i": i, "exc": et, "msg": msg, "s": 0.0})
                if stop:
                    break
                continue
            try:
                v = _eval(c, g)
                dt = _perf() - t0
                try:
                    tagged = _tag(v)
                except _BaseException as e:
                    et, msg = _short(e)
                    _emit({"k": "t", "i": i, "bad": msg, "s": dt})
                    if stop:
                        break
                    continue
                _emit({"k": "t", "i": i, "v": tagged, "s": dt})
            except _BaseException as e:
                dt = _perf() - t0
                et, msg = _short(e)
                _emit({"k": "t", "i": i, "exc": et, "msg": msg, "s": dt})
                if stop:
                    break
        if serve:
            _serve(g)
        _emit({"k": "done"})
    except _BaseException:
        pass
    _flush_exit(0)


# ---------------------------------------------------------------------------------------------------------
# Child checks in two processes. The program's process P answers calls; the checker C runs the check code on
# the plain data P returns. C holds the result fd and the check text (read only after P was forked, from a
# memfd the zygote filled without reading it), and is not dumpable, so P cannot forge C's records, read the
# expected values out of the check, or make the check pass with an object whose methods lie: C never touches
# an object of P's, only plain values (objects that are not plain data stay in P as opaque references).
# ---------------------------------------------------------------------------------------------------------
_REFS: list = []  # P: objects of the program that are not plain data, referred to by index


def _tag_or_ref(v):
    try:
        return _tag(v)
    except _BaseException:
        _REFS.append(v)
        return {"ref": _len(_REFS) - 1}


def _untag(x, depth=0):
    """Tagged JSON -> value (P reading the checker's arguments, C reading P's answers: then untrusted, and
    any malformed input raises, which fails the check)."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if x is None or _type(x) in (bool, str):
        return x
    if _type(x) is not dict or _len(x) != 1:
        raise ValueError("malformed tagged value")
    ((k, v),) = x.items()
    if k == "i":
        if _type(v) is int:
            return v
        if _type(v) is str and _len(v) <= 100_000:
            return int(v, 16)
        raise ValueError("bad int")
    if k == "f" and _type(v) is str and _len(v) <= 64:
        return float(v)
    if k == "c" and _type(v) is list and _len(v) == 2 and all(_type(p) is str and _len(p) <= 64 for p in v):
        return complex(float(v[0]), float(v[1]))
    if k == "b" and _type(v) is str:
        return bytes.fromhex(v)
    if k == "ref" and _type(v) is int:
        return _ref_value(v)
    if _type(v) is not list:
        raise ValueError("malformed tagged value")
    if k == "l":
        return [_untag(e, depth + 1) for e in v]
    if k == "t":
        return tuple(_untag(e, depth + 1) for e in v)
    if k == "s":
        return set(_untag(e, depth + 1) for e in v)
    if k == "fs":
        return frozenset(_untag(e, depth + 1) for e in v)
    if k == "d":
        out = {}
        for pair in v:
            if _type(pair) is not list or _len(pair) != 2:
                raise ValueError("malformed dict item")
            out[_untag(pair[0], depth + 1)] = _untag(pair[1], depth + 1)
        return out
    raise ValueError("unknown tag")


_IN_CHECKER = False


def _ref_value(i):
    if _IN_CHECKER:
        return _Remote(i)
    if not 0 <= i < _len(_REFS):
        raise ValueError("unknown reference")
    return _REFS[i]


def _read_line(fd, buf, cap):
    """One newline-terminated line from fd (bytes, without the newline), or None at EOF."""
    while True:
        j = buf.find(b"\n")
        if j >= 0:
            line = bytes(buf[:j])
            del buf[: j + 1]
            return line
        if _len(buf) > cap:
            raise ValueError("line too long")
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buf.extend(chunk)


def _serve(g):
    """P, after the program and the parent-graded calls: announce the program's names, answer calls."""
    names = {}
    for name, v in _list(dict.items(g)):
        if _type(name) is str and not name.startswith("__") and not _isinstance(v, _ModuleType):
            names[name] = _tag_or_ref(v)
    _flush_std()
    _emit({"k": "ready", "names": names})
    buf = bytearray()
    while True:
        try:
            line = _read_line(CHECK_FD, buf, 1 << 24)
        except _BaseException:
            line = None
        if line is None:
            _flush_exit(0)
        try:
            req = _loads(line)
            fn = _untag(req["f"])
            args = [_untag(a) for a in req["a"]]
            kwargs = {k: _untag(v) for k, v in req["kw"]}
        except _BaseException as e:
            _emit({"k": "r", "exc": "RuntimeError", "msg": "bad request: " + _short(e)[1]})
            continue
        try:
            rec = {"k": "r", "v": _tag_or_ref(fn(*args, **kwargs))}
        except _BaseException as e:  # SystemExit and KeyboardInterrupt too: the call failed
            et, msg = _short(e)
            rec = {"k": "r", "exc": et, "msg": msg}
        _flush_std()  # the checker may end P at any reply: keep its output
        _emit(rec)


class _Remote:
    """In the checker: an object of the program that is not plain data. It can be passed back to the program
    and called there; it equals only itself and has no truth value, attributes or other behaviour here."""

    __slots__ = ("_rid",)

    def __init__(self, rid):
        self._rid = rid

    def __call__(self, *args, **kwargs):
        return _CALL(self._rid, args, kwargs)

    def __eq__(self, other):
        return _type(other) is _Remote and other._rid == self._rid

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(("remote", self._rid))

    def __bool__(self):
        raise TypeError("an object of the program that is not plain data has no truth value in the check")

    def __repr__(self):
        return "<object of the program>"


_CALL = None


def _remote_exception(rec):
    import builtins

    name, msg = rec.get("exc"), rec.get("msg")
    name = name if _type(name) is str else "Exception"
    msg = msg[:300] if _type(msg) is str else ""
    cls = getattr(builtins, name, None) if name.isidentifier() else None
    if _isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(msg)
        except _BaseException:
            pass
    return RuntimeError(f"{name}: {msg}")


def _checker(req):
    """C: fork the program's process P, then (only then) read the check text and run it. Never returns."""
    global _IN_CHECKER, _CALL
    try:
        to_p_r, to_p_w = os.pipe()
        from_p_r, from_p_w = os.pipe()
        _prctl(PR_SET_DUMPABLE, 0)  # before the fork: no window in which P could open /proc/C/{mem,fd}
        pid = os.fork()
    except _BaseException as e:
        _emit({"k": "setup_err", "msg": "checker: " + repr(e)[:200]})
        _flush_exit(0)
    if pid == 0:  # P
        try:
            os.close(to_p_w)
            os.close(from_p_r)
            os.dup2(from_p_w, RESULT_FD)  # P's records go to the checker, never to the zygote
            os.dup2(to_p_r, CHECK_FD)  # replaces the check's memfd: P never had the check text
            os.close(from_p_w)
            os.close(to_p_r)
            _prctl(PR_SET_DUMPABLE, 1)
        except _BaseException:
            _exit(121)
        _program_side(req, serve=True)
    _IN_CHECKER = True
    os.close(to_p_r)
    os.close(from_p_w)
    cap = int(req["limits"]["result_bytes"])
    chunks = []
    while True:
        chunk = os.read(CHECK_FD, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(CHECK_FD)
    check = b"".join(chunks).decode("utf-8", "surrogateescape")
    del chunks
    buf = bytearray()
    started = False
    names = None
    while names is None:
        try:
            line = _read_line(from_p_r, buf, cap)
        except _BaseException:
            line = None
        if line is None:
            break
        try:
            rec = _loads(line)
        except _BaseException:
            continue
        if _type(rec) is not dict:
            continue
        k = rec.get("k")
        if k == "ready":
            names = rec.get("names") if _type(rec.get("names")) is dict else {}
        elif k in ("syntax", "prog_err", "start", "t"):  # P's own records; anything else from P is dropped
            started |= k == "start"
            _emit(rec)
    if names is None:  # P ended before the check could run (syntax error, exit, crash)
        if started:
            _emit({"k": "check", "ok": False, "exc": "RuntimeError", "msg": "the program's process ended"})
        _end_checker(pid)

    def call(rid, args, kwargs):
        kw = [[k, _tag(v)] for k, v in kwargs.items()]
        msg = {"f": {"ref": rid}, "a": [_tag(a) for a in args], "kw": kw}
        data = (_dumps(msg) + "\n").encode("utf-8", "surrogatepass")
        try:
            while data:
                data = data[os.write(to_p_w, data) :]
            line = _read_line(from_p_r, buf, cap)
        except OSError:
            line = None
        if line is None:
            raise RuntimeError("the program's process ended during the check")
        rec = _loads(line)
        if _type(rec) is not dict or rec.get("k") != "r":
            raise RuntimeError("the program's process broke the call protocol")
        if "exc" in rec:
            raise _remote_exception(rec)
        return _untag(rec.get("v"))

    _CALL = call
    try:
        import builtins

        # the program's names, as P announced them (P runs the candidate: it may send anything). A dunder
        # name is never bound (a forged "__builtins__" would replace every builtin the check calls), and a
        # name that shadows a builtin (a program's own `len`) is not bound into the check's namespace, where
        # the check's `len(...)` must stay the real one; every non-dunder name is also in `__program__`, for
        # checks that import the program as a module (grpo_jax.sandbox.pytest_tests)
        program = {}
        for name, tagged in names.items():
            if _type(name) is str and name.isidentifier() and not name.startswith("__"):
                program[name] = _untag(tagged)
        ns = {"__name__": "__main__", "__builtins__": builtins, "__program__": program}
        for name, value in program.items():
            if not hasattr(builtins, name):
                ns[name] = value
        _exec(_compile(check, "<check>", "exec"), ns)
        _emit({"k": "check", "ok": True})
    except _BaseException as e:
        et, msg = _short(e)
        _emit({"k": "check", "ok": False, "exc": et, "msg": msg})
    _emit({"k": "done"})
    _end_checker(pid)


def _end_checker(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    _flush_exit(0)


def _flush_std():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass


def _flush_exit(code):
    _flush_std()
    _exit(code)


# ---------------------------------------------------------------------------------------------------------
# Child setup
# ---------------------------------------------------------------------------------------------------------
def _set_rlimits(lim, mode, nproc=None):
    R = resource

    def setl(which, soft, hard=None):
        hard = soft if hard is None else hard
        try:
            cur_s, cur_h = R.getrlimit(which)
            if cur_h != R.RLIM_INFINITY and mode != "root":
                hard = min(hard, cur_h)
                soft = min(soft, hard)
            R.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            if mode == "root":
                raise

    setl(R.RLIMIT_CPU, int(lim["cpu_s"]), int(lim["cpu_s"]) + 1)
    setl(R.RLIMIT_AS, int(lim["memory_bytes"]))
    setl(R.RLIMIT_FSIZE, int(lim["file_bytes"]))
    setl(R.RLIMIT_NOFILE, int(lim["open_files"]))
    setl(R.RLIMIT_CORE, 0)
    setl(R.RLIMIT_STACK, 8 << 20)
    setl(R.RLIMIT_MEMLOCK, 0)
    setl(R.RLIMIT_MSGQUEUE, 0)
    # NPROC counts every process of the real uid system wide: exact with a dedicated uid per slot (root mode),
    # otherwise a coarse cap above what the user already runs
    setl(R.RLIMIT_NPROC, int(lim["processes"]) if mode == "root" else int(nproc or lim["processes"]))


def _drop_caps():
    """userns mode: the program would be root of its user ns; take every capability away for good."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    # SECBIT_NOROOT | NOROOT_LOCKED | NO_SETUID_FIXUP | its lock | KEEP_CAPS_LOCKED
    _libc.prctl(PR_SET_SECUREBITS, 0x01 | 0x02 | 0x04 | 0x08 | 0x20, 0, 0, 0)

    class Hdr(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("eff", ctypes.c_uint32), ("perm", ctypes.c_uint32), ("inh", ctypes.c_uint32)]

    hdr, data = Hdr(0x20080522, 0), (Data * 2)()
    _check(_libc.syscall(126, ctypes.byref(hdr), ctypes.byref(data)), "capset")  # SYS_capset


def child_c3(req, cfg, out_w, res_w, workdir, payload_fd, check_fd=None, stdin_fd=None, stdout_w=None):
    """The program's process. Ends in harness(), never returns. `req` is the request's header; the job itself
    (program, setup, calls) is read here from `payload_fd` (a sealed memfd S never read). A stdio test: fd 0
    is its input (`stdin_fd`, a sealed memfd), fd 1 its own stdout pipe (`stdout_w`), fd 2 the output pipe."""
    try:
        payload = _read_all(payload_fd)
        os.close(payload_fd)
        job = json.loads(payload)
        del payload
        if type(job) is not dict:
            raise ValueError("malformed request payload")
        req = {**job, **req}  # the header's limits, flags and sizes win
        mode = cfg["mode"]
        lim = req["limits"]
        if mode == "rlimits":
            os.setsid()
        if stdin_fd is not None:
            os.dup2(stdin_fd, 0)
            os.lseek(0, 0, os.SEEK_SET)
        else:
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        os.dup2(stdout_w if stdout_w is not None else out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(res_w, RESULT_FD)
        if check_fd is not None:
            os.dup2(check_fd, CHECK_FD)
            os.closerange(CHECK_FD + 1, 1 << 16)
        else:
            os.closerange(RESULT_FD + 1, 1 << 16)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1):
            signal.signal(s, signal.SIG_DFL)
        os.chdir(workdir)
        try:
            _write("/proc/self/oom_score_adj", "1000")  # the program goes first in an out-of-memory kill
        except OSError:
            pass
        if mode != "rlimits":
            _unshare(CLONE_NEWIPC)  # SysV IPC objects die with the program
        _set_rlimits(lim, mode, cfg.get("nproc"))
        if mode == "root":
            uid = cfg["uid"]
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise OSError("uid drop failed")
        elif mode == "userns":
            _drop_caps()
        if cfg.get("seccomp"):
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            SECCOMP.load()
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir})
        os.umask(0o077)
        if req.get("stdio") and req.get("input_file"):
            _place_input(req["input_file"])
        if req.get("stdio"):  # the standard streams of `python3 prog.py` on POSIX with pipes (pylifecycle.c)
            # the ignores: typeshed marks sys.__stdin__ / __stdout__ / __stderr__ Final; the child rebinds
            # them on purpose (as `python3 prog.py` has them)
            sys.stdin = sys.__stdin__ = open(  # type: ignore[misc]
                0, encoding="utf-8", errors="surrogateescape", newline="\n", closefd=False
            )
            sys.stdout = sys.__stdout__ = open(  # type: ignore[misc]
                1, "w", encoding="utf-8", errors="surrogateescape", newline="\n", closefd=False
            )
            sys.stderr = sys.__stderr__ = open(  # type: ignore[misc]  # stderr: line-buffered (buffering=1)
                2, "w", 1, encoding="utf-8", errors="backslashreplace", newline="\n", closefd=False
            )
        else:
            sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            sys.stdin = open(0, encoding="utf-8", closefd=False)
    except BaseException as e:
        try:
            os.write(res_w, (json.dumps({"k": "setup_err", "msg": repr(e)[:300]}) + "\n").encode())
        except BaseException:
            pass
        os._exit(120)
    harness(req)


def _plain_name(name):
    """A file-I/O test's file name (the executor validated it: types.plain_file_name_error; checked again
    here, as this process opens the output file with its privileges): a plain name of the work dir."""
    if (
        _type(name) is not str
        or not name
        or name in (".", "..")
        or "/" in name
        or "\0" in name
        or _len(name.encode("utf-8", "surrogateescape")) > 255
    ):
        raise ValueError(f"not a plain file name: {name!r:.80}")
    return name


def _place_input(name):
    """C, as the program's user, before the program runs: a file-I/O test's input (fd 0, its sealed memfd)
    copied in the kernel into `name` of the work dir (the cwd); then fd 0 is /dev/null, as open-r1's runner
    gives such a program no input on stdin."""
    fd = os.open(
        _plain_name(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        size, off = os.fstat(0).st_size, 0
        while off < size:
            n = os.sendfile(fd, 0, off, size - off)
            if n <= 0:
                raise OSError(errno.EIO, "short copy of the input file")
            off += n
    finally:
        os.close(fd)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def _open_output(workdir, name, info):
    """S, once the program's tree is gone (nothing can change the file any more): a file-I/O test's output
    file, opened without following a symlink and kept only if it is a regular file (a FIFO, a directory or a
    link to a file the program cannot read itself is refused); (fd, size), or None with the reason in
    info["output_file"]. Its bytes go to the executor with sendfile, never through this process's memory."""
    try:
        fd = os.open(
            os.path.join(workdir, _plain_name(name)),
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
        )
    except FileNotFoundError:
        info["output_file"] = "missing"
        return None
    except OSError as e:
        info["output_file"] = "a symbolic link" if e.errno == errno.ELOOP else f"unreadable: {e.strerror}"
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        info["output_file"] = "not a regular file"
        return None
    info["output_file"] = "ok"
    return fd, st.st_size


# ---------------------------------------------------------------------------------------------------------
# Zygote side: run one job, enforce wall/output/result caps, kill the tree, verify
# ---------------------------------------------------------------------------------------------------------
def _uid_pids(uid):
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for n in names:
        if n.isdigit():
            try:
                if os.stat(f"/proc/{n}").st_uid == uid:
                    found.append(int(n))
            except OSError:
                pass
    return found


def _session_pids(sid):
    found = []
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                with open(f"/proc/{n}/stat", "rb") as f:
                    s = f.read()
                fields = s[s.rindex(b")") + 2 :].split()
                if int(fields[3]) == sid or int(fields[2]) == sid:  # session id or process group
                    found.append(int(n))
            except (OSError, ValueError, IndexError):
                pass
    return found


def _ns_pids():
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and n != "1"]


def _sweep_ns():
    """Kill every process of this pid namespace except ourselves (we are its init), reap, verify."""
    if os.getpid() != 1:  # kill(-1) as root is only safe as the init of a private pid namespace
        raise RuntimeError("refusing kill(-1) outside a pid namespace")
    killed = 0
    for _ in range(500):
        _reap()
        left = _ns_pids()
        if not left:
            return killed, True
        killed = max(killed, len(left))
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.002)
    _reap()
    return killed, not _ns_pids()


_REAPED: dict[int, int] = {}  # pid -> wait status collected by _reap()


def _wait_for(pid):
    """waitpid(pid) that also finds a status already collected by _reap()."""
    if pid in _REAPED:
        return _REAPED.pop(pid)
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue
        except ChildProcessError:
            return _REAPED.pop(pid, 0)


def _reap():
    while True:
        try:
            p, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if p == 0:
            return
        if len(_REAPED) < 64:
            _REAPED[p] = st


def _fresh_tmp(lim, uid):
    try:
        _libc.umount2(b"/tmp", MNT_DETACH)
    except Exception:
        pass
    _mount(
        "tmpfs",
        "/tmp",
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={int(lim['workdir_bytes'])},nr_inodes={int(lim.get('workdir_inodes', 4096))},"
        f"mode=0700,uid={uid},gid={uid}",
    )


def run_job(req, cfg, req_fd, fds):
    """Run one request in a fresh child; (info, parts, memfds): the response parts (result records, output
    excerpt, and for a stdio request its whole stdout, or a file-I/O test's output file) as `_send` segments
    of memfds (or of that file), and the fds to close once sent. `req` is the request's header; `fds` holds
    the request's sealed memfds ("payload", and "check" / "stdin" where the request has them), which go to
    the child and are closed here (and taken out of `fds`) as soon as it is forked. What the child writes is
    spliced from its pipes into memfds and sent with sendfile: it never enters this process's memory, so no
    later child (a fork of this process) can find an earlier program's results or output in it (an earlier
    candidate's answers, another test's output)."""
    lim = req["limits"]
    mode = cfg["mode"]
    ns = mode != "rlimits"
    out_name = _plain_name(req["output_file"]) if req.get("stdio") and req.get("output_file") else None
    t0 = time.monotonic()
    deadline = t0 + float(lim["wall_s"])
    out_cap, res_cap = int(lim["output_bytes"]), int(lim["result_bytes"])
    info = {"timed_out": False, "output_limit": False, "result_limit": False, "infra": "", "leftover": 0}
    if ns:
        _fresh_tmp(lim, cfg["uid"] if mode == "root" else 0)
        workdir = "/tmp"
    else:
        workdir = tempfile.mkdtemp(prefix="grpo-sbx-")
    res_r, res_w = os.pipe()
    out_r, out_w = os.pipe()
    so_r, so_w = os.pipe() if req.get("stdio") else (None, None)
    pid = os.fork()
    if pid == 0:
        os.close(res_r)
        os.close(out_r)
        if so_r is not None:
            os.close(so_r)
        child_c3(req, cfg, out_w, res_w, workdir, fds["payload"], fds.get("check"), fds.get("stdin"), so_w)
    for name in list(fds):  # the child has them; S keeps none of the job's text, not even an fd
        os.close(fds.pop(name))
    os.close(res_w)
    os.close(out_w)
    if so_w is not None:
        os.close(so_w)
    pidfd = os.pidfd_open(pid)
    sink = {fd: os.memfd_create(name, os.MFD_CLOEXEC) for fd, name in ((res_r, "result"), (out_r, "output"))}
    if so_r is not None:
        sink[so_r] = os.memfd_create("stdout", os.MFD_CLOEXEC)
    size = dict.fromkeys(sink, 0)
    out_total = 0  # stdout + stderr, against the output cap
    open_fds = set(sink)
    exited = False
    killed = False
    status = None

    def kill_tree():
        nonlocal killed
        killed = True
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        if ns:
            n, ok = _sweep_ns()
        else:
            for p in _session_pids(pid):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass

    def take(fd):
        """Splice what the pipe holds into its memfd (at most one byte beyond the cap, to see an overflow).
        (bytes moved, within the caps)."""
        nonlocal out_total
        room = res_cap - size[fd] if fd == res_r else out_cap - out_total
        try:
            n = os.splice(fd, sink[fd], max(1, min(1 << 20, room + 1)))
        except OSError:
            return 0, True
        size[fd] += n
        if fd == res_r:
            if size[fd] > res_cap:
                info["result_limit"] = True
                return n, False
            return n, True
        out_total += n
        if out_total > out_cap:
            info["output_limit"] = True
            return n, False
        return n, True

    watch_req = True
    drain_until = None
    while open_fds or not exited:
        now = time.monotonic()
        if not killed and now >= deadline:
            info["timed_out"] = True
            kill_tree()
        if drain_until is not None and now > drain_until:
            break  # the writers are dead or unkillable: stop waiting for EOF
        rl = list(open_fds)
        if not exited:
            rl.append(pidfd)
        if watch_req:
            rl.append(req_fd)
        if killed or exited:
            timeout = 0.5
        else:
            timeout = max(0.0, deadline - now)
        try:
            r, _, _ = select.select(rl, [], [], timeout)
        except InterruptedError:
            continue
        for fd in r:
            if fd == req_fd:
                if not os.read(req_fd, 1):  # the executor is gone: end everything
                    kill_tree()
                    os._exit(0)
                watch_req = False
            elif fd == pidfd:
                exited = True
                status = _wait_for(pid)
                # the program is over: its whole tree goes with it
                if ns:
                    n, _ok = _sweep_ns()
                    info["leftover"] = n
                else:
                    left = _session_pids(pid)
                    if left:
                        info["leftover"] = len(left)
                        kill_tree()
                drain_until = time.monotonic() + 2.0
            else:
                n, ok = take(fd)
                if not n:
                    open_fds.discard(fd)
                    os.close(fd)
                elif not ok and not killed:
                    kill_tree()
    for fd in open_fds:
        os.close(fd)
    os.close(pidfd)
    if status is None:
        status = _wait_for(pid)
    _REAPED.clear()
    if os.WIFSIGNALED(status):
        info["signal"] = os.WTERMSIG(status)
    else:
        info["exit"] = os.WEXITSTATUS(status)
    info["killed"] = killed
    if ns:
        n, ok = _sweep_ns()
        info["leftover"] = max(info["leftover"], n)
        if not ok:
            info["infra"] = "processes survive SIGKILL in the slot's pid namespace"
    out_file = _open_output(workdir, out_name, info) if out_name else None  # before the rlimits tier's rmtree
    if not ns:
        for _ in range(50):
            left = _session_pids(pid)
            if not left:
                break
            info["leftover"] = max(info["leftover"], len(left))
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        _reap()
        _rmtree(workdir)
    info["secs"] = time.monotonic() - t0
    info["out_total"] = out_total
    res = [(sink[res_r], 0, min(size[res_r], res_cap))]
    n_err = size[out_r]  # the output excerpt: the first and the last 2 KiB
    out = [(sink[out_r], 0, min(n_err, 2048))]
    if n_err > 2048:
        out += [b"\n...\n", (sink[out_r], n_err - 2048, 2048)]
    parts = [res, out]
    memfds = list(sink.values())
    if out_file is not None:  # a file-I/O test: its output file is the answer, its stdout is not
        fd, n = out_file
        memfds.append(fd)
        if n > out_cap:
            info["output_limit"] = True
        parts.append([(fd, 0, min(n, out_cap))])
    elif out_name:
        parts.append(b"")
    elif so_r is not None:
        parts.append([(sink[so_r], 0, min(size[so_r], out_cap))])
    return info, parts, memfds


def _rmtree(path):
    if not path:
        return
    for root, dirs, _files in os.walk(path, followlinks=False):
        for d in dirs:
            p = os.path.join(root, d)
            try:
                if not os.path.islink(p):
                    os.chmod(p, 0o700)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# Framing and main loop
# ---------------------------------------------------------------------------------------------------------
def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _read_memfd(fd, n, name):
    """The next `n` bytes of the request pipe, spliced into a new sealed memfd (positioned at its start) in
    the kernel: they never pass through this process's memory (no buffer, no bytes or str object here). None
    if the pipe ended first."""
    mfd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        got = 0
        while got < n:
            k = os.splice(fd, mfd, min(n - got, 1 << 24))
            if k == 0:
                os.close(mfd)
                return None
            got += k
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, seals)  # the program cannot change its input, even for itself
        os.lseek(mfd, 0, os.SEEK_SET)
    except BaseException:
        os.close(mfd)
        raise
    return mfd


def _read_all(fd):
    """C: the whole of a memfd, from its current position."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _read_request(fd):
    """The next request: (header, {"payload", "check", "stdin": sealed memfd}); (None, {}) at the end of the
    pipe, on "quit", or when the framing is broken (the executor then restarts the slot). The header is the
    only part parsed here: the limits, flags and sizes, never any of the job's text."""
    hdr = _read_exact(fd, 4)
    if hdr is None:
        return None, {}
    n = struct.unpack("!I", hdr)[0]
    if n > MAX_HEADER:
        return None, {}
    body = _read_exact(fd, n)
    if body is None:
        return None, {}
    try:
        req = json.loads(body)
        if type(req) is not dict or req.get("op") == "quit":
            return None, {}
        sizes = [
            ("payload", int(req["payload_len"]), MAX_PAYLOAD),
            ("check", int(req.get("check_len") or 0), MAX_CHECK),
            ("stdin", int(req.get("stdin_len") or 0), MAX_STDIN),
        ]
        if type(req.get("limits")) is not dict:
            raise ValueError("no limits")
    except (ValueError, TypeError, KeyError):
        return None, {}
    fds = {}
    for name, size, cap in sizes:
        if not 0 <= size <= cap:
            break
        if name == "payload" or size or (name == "stdin" and req.get("stdio")):
            mfd = _read_memfd(fd, size, name)
            if mfd is None:
                break
            fds[name] = mfd
    else:
        return req, fds
    for mfd in fds.values():
        os.close(mfd)
    return None, {}


def _send(fd, header, *blobs):
    """A response: the header, then each blob with its length. A blob is bytes, or a list of segments: bytes
    or (fd, offset, count) of a memfd, sent with sendfile (the child's bytes never pass through here)."""
    h = json.dumps(header).encode()
    _write_all(fd, struct.pack("!I", len(h)) + h)
    for b in blobs:
        segs = [b] if _isinstance(b, bytes) else b
        total = sum(_len(x) if _isinstance(x, bytes) else x[2] for x in segs)
        _write_all(fd, struct.pack("!I", total))
        for x in segs:
            if _isinstance(x, bytes):
                _write_all(fd, x)
                continue
            src, off, n = x
            while n > 0:
                k = os.sendfile(fd, src, off, n)
                if k == 0:  # the memfd is shorter than announced: cannot happen; keep the framing
                    _write_all(fd, bytes(n))
                    break
                off, n = off + k, n - k


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


SECCOMP = None


def main():
    global SECCOMP
    cfg = json.loads(sys.argv[1])
    req_fd, resp_fd = os.dup(0), os.dup(1)
    os.set_inheritable(req_fd, False)
    os.set_inheritable(resp_fd, False)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")
    mode = cfg["mode"]
    hello = {"ok": True, "mode": mode, "errors": {}, "seccomp": False, "denied": [], "cgroup": False}
    # join the slot's cgroups first, before anything is forked: every program of this slot is inside them
    try:
        for procs in cfg.get("cgroup_procs") or ():
            _write(procs, str(os.getpid()))
        hello["cgroup"] = bool(cfg.get("cgroup_procs"))
    except OSError as e:
        hello["errors"]["cgroup"] = repr(e)
    try:
        _write("/proc/self/oom_score_adj", "-1000")  # an OOM kill in the slot's group takes the program
    except OSError:
        pass  # lowering it needs CAP_SYS_RESOURCE; the programs still raise theirs to 1000
    if cfg.get("seccomp"):
        try:
            SECCOMP = Seccomp()
            hello["seccomp"] = True
            hello["denied"] = SECCOMP.denied
        except Exception as e:
            cfg["seccomp"] = False
            hello["errors"]["seccomp"] = repr(e)
    if mode != "root":
        # RLIMIT_NPROC counts every process of the real uid: leave room for the ones that already exist
        mine = len([n for n in os.listdir("/proc") if n.isdigit() and _owner(n) == os.getuid()])
        cfg["nproc"] = mine + 64
    if mode in ("root", "userns"):
        try:
            build_root(mode == "userns")
            if mode == "root" and _uid_pids(cfg["uid"]):
                raise RuntimeError(f"processes of uid {cfg['uid']} already exist")
            _unshare(CLONE_NEWPID)
            spid = os.fork()
            if spid != 0:
                # outer process: the slot's pid-namespace init does the work; follow it and exit with it
                os.close(req_fd)
                os.close(resp_fd)
                while True:
                    try:
                        os.waitpid(spid, 0)
                        break
                    except InterruptedError:
                        continue
                os._exit(0)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getpid() != 1:
                raise RuntimeError("not the init of a new pid namespace")
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        except Exception as e:
            hello["ok"] = False
            hello["errors"]["namespaces"] = repr(e)
    _send(resp_fd, hello)
    if not hello["ok"]:
        return
    while True:
        req, fds = _read_request(req_fd)
        if req is None:
            break  # the executor is gone, said quit, or broke the framing: end the slot (it restarts us)
        memfds = []
        try:
            info, parts, memfds = run_job(req, cfg, req_fd, fds)
        except Exception:
            info = {"infra": "zygote: " + traceback.format_exc()[-400:]}
            parts = [b"", b"", b""] if req.get("stdio") else [b"", b""]
        finally:
            for mfd in fds.values():  # run_job failed before its fork
                os.close(mfd)
        info["id"] = req.get("id")
        try:
            _send(resp_fd, info, *parts)
        finally:
            for m in memfds:
                os.close(m)
    if os.getpid() == 1:
        _sweep_ns()
    os._exit(0)


def _owner(n):
    try:
        return os.stat(f"/proc/{n}").st_uid
    except OSError:
        return -1


if __name__ == "__main__":
    main()
