"""The seccomp filter of every sandbox: the system calls a shell task or a unit test never needs are refused.

Compiled by libseccomp (the library systemd, Docker and Flatpak use) through ``pyseccomp``, a ctypes binding with
the API of libseccomp's own Python module: libseccomp checks the architecture (a 32-bit or x32 system call made
to dodge the table is killed) and emits the BPF program that ``bwrap --seccomp FD`` (or ``prctl``) loads.

Refused with EPERM: the kernel's keyring, BPF, perf events, ptrace and taking other processes' memory or files, kernel
modules and kexec, handle-based file access (``open_by_handle_at`` reaches files outside any mount namespace),
mounting and entering or making namespaces (``unshare``, ``setns``, ``clone`` with ``CLONE_NEW*``), swap,
reboot, the kernel log, accounting, io_uring (a second way to make most calls past a filter), userfaultfd,
changing the personality, faking terminal input (``TIOCSTI``, ``TIOCLINUX``), and sockets other than Unix,
IPv4, IPv6 and netlink (vsock reaches this virtual machine's host whatever the network namespace).
``clone3`` gets ENOSYS (its flags sit in memory a filter cannot read): the C library then uses ``clone``.
"""

from __future__ import annotations

import errno
import tempfile

import pyseccomp as sc

DENIED = [
    "acct",
    "add_key",
    "bpf",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "personality",
    "pidfd_getfd",
    "pivot_root",
    "process_madvise",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "setns",
    "swapoff",
    "swapon",
    "syslog",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "vhangup",
]
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME: clone with any of them is refused.
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80)
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
ALLOWED_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK


def bpf_program() -> bytes:
    """The compiled filter (a ``struct sock_filter`` array) for the native architecture."""
    deny = sc.ERRNO(errno.EPERM)
    rules = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED:
        rules.add_rule(deny, name)
    rules.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in CLONE_NEW_FLAGS:
        rules.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in (TIOCSTI, TIOCLINUX):
        rules.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    # Every family but the allowed ones: refuse socket(domain) with domain outside the list.
    for family in range(46):
        if family not in ALLOWED_FAMILIES:
            rules.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.EQ, family))
    rules.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.GE, 46))
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()
