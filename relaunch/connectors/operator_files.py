"""Who could have written a file the operator configured and Relaunch reads as trusted evidence
(a node's kernel log, telemetry files, the console's tokens file): only root, this service's own
account or a system account may, on the file and on every directory above it; a file an
ordinary user could write or replace is refused with the reason (docs/trust.md, "The kernel log
quotes a user's text")."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat


def _login_defs(key: str, default: int) -> int:
    with (
        contextlib.suppress(OSError, ValueError),
        open("/etc/login.defs", encoding="utf-8", errors="replace") as fh,
    ):
        for line in fh:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == key:
                return int(parts[1])
    return default


def _system_uid(uid: int) -> bool:
    """Root, this service's own account, or a system account (below UID_MIN; not nobody)."""
    return uid in (0, os.geteuid()) or (uid < _login_defs("UID_MIN", 1000) and uid != 65534)


def _system_gid(gid: int) -> bool:
    """A group no ordinary user is in: root's, this service's own, or a system group (below
    GID_MIN) none of whose members, named or by their primary group, is an ordinary user."""
    if gid in (0, os.getegid()):
        return True
    if gid >= _login_defs("GID_MIN", 1000) or gid == 65534:
        return False
    try:
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        members = []
    for name in members:
        with contextlib.suppress(KeyError):
            if not _system_uid(pwd.getpwnam(name).pw_uid):
                return False
    return all(_system_uid(p.pw_uid) for p in pwd.getpwall() if p.pw_gid == gid)


def _writers(st: os.stat_result, *, directory: bool) -> str | None:
    """Who other than root or a system account may write ``st``, in words; None if nobody."""
    mode = st.st_mode
    if not _system_uid(st.st_uid):
        return f"owned by uid {st.st_uid}"
    if directory and mode & stat.S_ISVTX:
        return None  # a sticky directory: no one replaces a file they do not own
    if mode & stat.S_IWOTH:
        return f"writable by anyone (mode {stat.S_IMODE(mode):04o})"
    if mode & stat.S_IWGRP and not _system_gid(st.st_gid):
        return f"writable by group {st.st_gid} (mode {stat.S_IMODE(mode):04o})"
    return None


def operator_file_problem(path: str, st: os.stat_result, real: str | None = None) -> str | None:
    """Why an ordinary user could have written the operator-configured file ``path`` (its
    stat ``st``, its real path ``real``), or None when only root, the service's account or a
    system account could: checked on the file and every directory above it."""
    real = real or os.path.realpath(path)
    problem = _writers(st, directory=False)
    if problem:
        return (
            f"{path}: {problem}; a file read as trusted evidence must be writable only by "
            "root or a system account"
        )
    parent = os.path.dirname(real)
    while True:
        try:
            dst = os.stat(parent)
        except OSError:
            return f"{path}: cannot check directory {parent}"
        problem = _writers(dst, directory=True)
        if problem:
            return (
                f"{path}: its directory {parent} is {problem}, so another file could be put in "
                "its place; a file read as trusted evidence must be writable only by root or a "
                "system account"
            )
        if parent == "/":
            return None
        parent = os.path.dirname(parent)
