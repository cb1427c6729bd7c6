"""Landlock scoping: the agent and everything it starts cannot connect to an abstract unix
socket made outside the sandbox (Linux 6.12+, Landlock ABI 6).

Abstract sockets have no path, so a mount view cannot hide them; they belong to a network
namespace. A sandbox with the network blocked has its own; one with the host's network
would reach the host's (X servers, D-Bus, container runtimes) without this scope. Sockets
made inside the sandbox stay reachable from it. Stdlib only (ctypes), as the rest of the
agent; importable as `orchard_gym.agent.scope` too (the local backend asks `abi()`).
"""

from __future__ import annotations

import ctypes
import os
import struct

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446  # the same on every architecture
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1
SCOPE_ABI = 6  # the first Landlock ABI with scopes


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    try:
        version = _libc().syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                                  ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(version))


def scope_abstract_unix_sockets() -> None:
    """Restrict this process and its future children; OSError where the kernel cannot."""
    libc = _libc()
    # struct landlock_ruleset_attr {u64 handled_access_fs, handled_access_net, scoped}: no
    # file system or network rule, only the scope
    raw = struct.pack("=QQQ", 0, 0, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET)
    attr = ctypes.create_string_buffer(raw, len(raw))
    fd = libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), attr, ctypes.c_size_t(len(raw)),
                      ctypes.c_uint32(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)} (Landlock ABI {abi()}, scopes need "
                           f"{SCOPE_ABI})")
    try:
        if libc.prctl(38, 1, 0, 0, 0) < 0:  # PR_SET_NO_NEW_PRIVS: Landlock's condition without CAP_SYS_ADMIN
            err = ctypes.get_errno()
            raise OSError(err, f"no_new_privs: {os.strerror(err)}")
        if libc.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(fd)
