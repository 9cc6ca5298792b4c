"""The bubblewrap sandbox: a throwaway Debian system per episode whose root is not the host's root.

Start (:mod:`.jail`): the sandbox's cgroups (memory, processes, no real-time CPU), a tmpfs of the disk limit
holding the agent's overlay over a read-only Debian root (``make sandbox`` builds it with ids shifted), a user
namespace whose root is host uid 1,000,000, then ``bwrap`` with new PID, network (loopback only), IPC, UTS,
cgroup and mount namespaces, its own ``/proc`` and a minimal ``/dev`` (null, zero, full, random, urandom, tty),
no ``/sys``, nothing of the host bound in, the untouched root read-only at ``/.pristine``.

Inside, PID 1 is the holder, a small Python server run from the root as it was at start: it makes ``/proc/sys``,
``/proc/sysrq-trigger``, ``/proc/irq`` and ``/proc/bus`` read-only, turns itself non-dumpable, and reads one JSON
request per line on its stdin. Each request runs as ``bash -c`` in a new session, output captured through a
pipe, so files, users and background jobs (``cmd &``) persist between commands; a command past its timeout has
its process group killed. Being PID 1 of its namespace, the holder cannot be killed from inside (``kill -9 -1``
spares it), and it reaps orphans. Before ``exec`` each command gets:

- the seccomp filter of :mod:`.seccomp` (no mount, namespaces, ptrace, keyring, BPF, io_uring, vsock...);
- a capability bounding set of Docker's defaults (chown, dac_override, fowner, fsetid, kill, setgid, setuid,
  setpcap, net_bind_service, net_raw, sys_chroot, mknod, audit_write, setfcap), all within the user namespace.

:meth:`BwrapSandbox.check` runs a checker's script (a task's evaluation) differently: in a private copy of the
agent's mount namespace where ``/usr`` is the pristine tree except ``/usr/bin``, ``/usr/sbin`` and ``/usr/local``,
which are read-only unions where the original files win and the agent's new ones show through (tasks install
scripts the evaluation runs, e.g. ``/usr/bin/user_check``); ``/bin``, ``/sbin``, ``/lib``, ``/lib64`` are bound to
those, ``/etc/alternatives``, ``/etc/ld.so.cache``, ``/etc/nsswitch.conf`` and ``/etc/python3*`` are the
originals, an ``/etc/ld.so.preload`` is hidden, ``/usr/local/lib/python3*`` masked (no ``.pth`` file of the agent
runs), and ``PATH`` puts ``/usr/bin`` before ``/usr/local/bin``. So the shell, the loader, the C library,
coreutils and Python it runs are the originals whatever the agent replaced; a path the agent turned into a file
makes the check fail, it never runs the agent's binaries instead. The checker also keeps ``CAP_SYS_PTRACE``,
which the agent lacks, so the agent's processes cannot open its memory (``/proc/PID/mem`` needs the opener's
capabilities to cover the target's). What remains possible: the checker reads the agent's files and sees its
processes (that is what it checks); a process the agent left running keeps running during the check and may
change what it reads; a program the evaluation itself runs (one the agent wrote, or a command the pristine root
lacks) is the agent's code; a system file the agent deleted or changed under ``/usr`` still looks original to
the checker; configuration the original tools read stays the agent's (``/etc/profile*``, PAM, zsh's startup
files when the evaluation starts ``su`` or ``zsh``; new files in ``gconv-modules.d``...): tasks check it.

Teardown kills the whole cgroup (frozen first, so nothing forks meanwhile); the private mount namespace and
its tmpfs vanish with its last process.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from memrl_harness.backends.cgroups import Cgroups, Limits
from memrl_harness.backends.jail import Staging, ids_shifted, launch, require_jail
from memrl_harness.backends.sandbox import CommandResult, SandboxError
from memrl_harness.backends.seccomp import bpf_program
from memrl_harness.install import ENV_ROOTFS, default_rootfs, rootfs_hint

OUTPUT_LIMIT = 65536
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CHECK_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"
# Docker's default capabilities (numbers from linux/capability.h): what root in a shell task keeps.
AGENT_CAPS = (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31)
CAP_SYS_PTRACE = 19

# The holder: PID 1 inside the sandbox, run by the root's own python3 (argv: seccomp program in hex, output
# limit, agent PATH, checker PATH, agent capabilities as JSON, the checker's extra capability). Single-threaded,
# so preexec_fn is safe.
_HOLDER = r"""
import ctypes, json, os, select, signal, subprocess, sys, time
BPF, LIMIT, PATH, CHECK_PATH = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
AGENT_CAPS = set(json.loads(sys.argv[5]))
CHECK_CAPS = AGENT_CAPS | {int(sys.argv[6])}
LAST_CAP = int(open("/proc/sys/kernel/cap_last_cap").read())
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

PROGRAM = Program(len(BPF) // 8, BPF)
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18

def ok(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

def bind(src, dst, flags=0):
    ok(libc.mount(src.encode(), dst.encode(), None, MS_BIND | MS_REC | flags, None), f"bind {src} on {dst}")

def read_only(path):
    bind(path, path)
    ok(libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), f"remount {path}")

def pristine_view():
    ok(libc.unshare(0x20000), "unshare")
    ok(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "private")
    P = "/.pristine"
    bind("/usr", P + "/mnt")  # the agent's /usr, held while the original one covers it
    bind(P + "/usr", "/usr")
    for name in ("bin", "sbin", "local"):  # the agent's new commands show through; the originals win
        if os.path.isdir(f"{P}/mnt/{name}"):
            union = f"lowerdir={P}/usr/{name}:{P}/mnt/{name}".encode()
            ok(libc.mount(b"overlay", f"/usr/{name}".encode(), b"overlay", MS_RDONLY, union), f"union /usr/{name}")
    ok(libc.umount2(f"{P}/mnt".encode(), 2), "release")
    for name in os.listdir("/usr/local/lib") if os.path.isdir("/usr/local/lib") else ():
        if name.startswith("python"):  # site folders whose .pth files Python would run
            bind(P + "/media", "/usr/local/lib/" + name)
    for target in ("/bin", "/sbin", "/lib", "/lib64"):
        bind("/usr" + target, target)
    for name in os.listdir(P + "/etc"):
        if name in ("alternatives", "ld.so.cache", "nsswitch.conf") or name.startswith("python3"):
            bind(P + "/etc/" + name, "/etc/" + name)
    if os.path.lexists("/etc/ld.so.preload"):
        bind("/dev/null", "/etc/ld.so.preload")

def confine(check):
    def apply():
        if check:
            pristine_view()
        keep = CHECK_CAPS if check else AGENT_CAPS
        for cap in range(LAST_CAP + 1):
            if cap not in keep:
                ok(libc.prctl(24, cap, 0, 0, 0), "drop capability")
        ok(libc.prctl(22, 2, ctypes.addressof(PROGRAM), 0, 0), "seccomp")
    return apply

for knob in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"):
    if os.path.exists(knob):
        read_only(knob)
ok(libc.prctl(4, 0, 0, 0, 0), "non-dumpable")
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
base_env = {"HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash", "LANG": "C.UTF-8",
            "TERM": "xterm"}
lingering, reaped, pending = [], {}, b""

def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reaped[pid] = os.waitstatus_to_exitcode(status)

def discard(fd):
    try:
        data = os.read(fd, 65536)
    except OSError:
        data = b""
    if not data:
        os.close(fd)
        lingering.remove(fd)

def answer(payload):
    data = (json.dumps(payload) + "\n").encode()
    while data:
        data = data[os.write(1, data):]

def run(request):
    check = bool(request.get("check"))
    read_fd, write_fd = os.pipe()
    env = dict(base_env, PATH=CHECK_PATH if check else PATH)
    reaped.clear()  # orphans' statuses; a stale one could carry the pid the new command gets
    try:
        process = subprocess.Popen(["/usr/bin/bash" if check else "/bin/bash", "-c", request["script"]],
                                   stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, cwd="/", env=env,
                                   start_new_session=True, preexec_fn=confine(check))
    except Exception as exc:
        os.close(read_fd)
        os.close(write_fd)
        return {"exit_code": 126, "output": f"sandbox: cannot run the command: {exc}", "timed_out": False}
    os.close(write_fd)
    kept, size, is_open, timed_out, ended = [], 0, True, False, None
    deadline = time.monotonic() + request["timeout"]
    while True:
        reap()
        now = time.monotonic()
        if ended is None and process.pid in reaped:
            ended = now
        if ended is not None and (not is_open or now - ended > 0.2):
            break
        if ended is None and now > deadline:
            timed_out = True
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
            deadline = float("inf")
        ready = select.select(([read_fd] if is_open else []) + lingering, [], [], 0.02)[0]
        for fd in ready:
            if fd != read_fd:
                discard(fd)
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                is_open = False
                os.close(read_fd)
            elif size < LIMIT:
                kept.append(chunk[: LIMIT - size])
            size += len(chunk)
    if is_open:  # a background job holds the pipe: drained (and discarded) from now on
        lingering.append(read_fd)
    code = reaped.pop(process.pid)
    process.returncode = code
    return {"exit_code": code, "output": b"".join(kept).decode("utf-8", "replace"), "timed_out": timed_out}

answer({"ready": True})
while True:
    while b"\n" not in pending:
        reap()
        for fd in select.select([0] + lingering, [], [], 1.0)[0]:
            if fd != 0:
                discard(fd)
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                sys.exit(0)
            pending += chunk
    line, pending = pending.split(b"\n", 1)
    answer(run(json.loads(line)))
"""


def check_prerequisites(rootfs: Path) -> None:
    """Raise with what is missing and how to install it (``make sandbox`` in a checkout)."""
    require_jail()
    problems = []
    if not (rootfs / "usr" / "bin" / "python3").exists():
        problems.append(f"no root filesystem at {rootfs} (set {ENV_ROOTFS} or --option rootfs=PATH)")
    elif not ids_shifted(rootfs):
        problems.append(f"{rootfs} is not stored with shifted ids (python -m memrl_harness.backends.jail {rootfs})")
    if problems:
        raise SandboxError("bubblewrap sandbox unavailable: " + "; ".join(problems) + " -- " + rootfs_hint(rootfs))


class BwrapSandbox:
    """One episode's Debian system (see the module doc). Use as a context manager."""

    def __init__(
        self, rootfs: str | Path | None = None, command_timeout: float = 20.0, limits: Limits | None = None
    ) -> None:
        self.rootfs = Path(rootfs) if rootfs else default_rootfs()
        check_prerequisites(self.rootfs)
        self.command_timeout = float(command_timeout)
        self.limits = limits or Limits()
        self._lock = threading.Lock()
        self._closed = False
        self.dir = Path(tempfile.mkdtemp(prefix="memrl-bwrap-"))
        self.dir.chmod(0o711)  # the sandbox's root (host uid 1,000,000) passes through to its mount point
        self.staging = Staging(self.dir / "mnt")
        self.staging.folder.mkdir()
        self.cgroups = Cgroups(self.limits)
        args = ["--bind", self.staging.root, "/", "--ro-bind", self.staging.pristine, "/.pristine"]
        args += ["--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
        args += ["--unshare-uts", "--unshare-cgroup", "--hostname", "llb-os", "--as-pid-1", "--die-with-parent"]
        args += ["--new-session", "--clearenv", "--setenv", "PATH", PATH, "--chdir", "/"]
        holder = [_HOLDER, bpf_program().hex(), str(OUTPUT_LIMIT), PATH, CHECK_PATH, json.dumps(AGENT_CAPS)]
        args += ["/usr/bin/python3", "-I", "-S", "-c", *holder, str(CAP_SYS_PTRACE)]
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (bwrap's messages, read on failure, closed in close)
        try:
            self.process = launch(
                args,
                self.cgroups,
                self.limits,
                staging=self.staging,
                rootfs=self.rootfs,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
            )
            assert self.process.stdout is not None
            if not self.process.stdout.readline().startswith('{"ready"'):
                raise SandboxError(f"sandbox did not start: {self._stderr_tail()}")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run ``script`` as the agent (``bash -c``); its process group dies at the timeout."""
        return self._request(script, timeout, check=False)

    def check(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run a checker's ``script`` with the pristine shell and tools over the agent's system (module doc)."""
        return self._request(script, timeout, check=True)

    def _request(self, script: str, timeout: float | None, check: bool) -> CommandResult:
        limit = self.command_timeout if timeout is None else float(timeout)
        started = time.monotonic()
        with self._lock:
            if self._closed or self.process.poll() is not None:
                raise SandboxError(f"sandbox is not running: {self._stderr_tail()}")
            assert self.process.stdin is not None and self.process.stdout is not None
            try:
                self.process.stdin.write(json.dumps({"script": script, "timeout": limit, "check": check}) + "\n")
                self.process.stdin.flush()
            except OSError as exc:
                raise SandboxError(f"sandbox holder gone: {exc!r} {self._stderr_tail()}") from exc
            # The holder enforces the timeout; this guard only catches a hung holder.
            guard = threading.Timer(limit + 30, self.cgroups.kill)
            guard.start()
            try:
                line = self.process.stdout.readline()
            finally:
                guard.cancel()
        if not line:
            raise SandboxError(f"sandbox holder died: {self._stderr_tail()}")
        answer = json.loads(line)
        return CommandResult(
            int(answer["exit_code"]), answer["output"], bool(answer["timed_out"]), time.monotonic() - started
        )

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace")[-2000:]
        return ""

    def close(self) -> None:
        """Kill everything in the sandbox and remove it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        cgroups = getattr(self, "cgroups", None)
        if cgroups is not None:
            cgroups.destroy()
        process = getattr(self, "process", None)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
        with contextlib.suppress(AttributeError):
            self._stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)
