"""Safe reads of files a job controls (its stdout/stderr) and of the per-node files an operator
configured (kernel logs, the agents' telemetry: read with these rules by
``relaunch.connectors.telemetry.files``).

A job's output paths are the job's user's choice: ``-e /etc/relaunch/env`` or ``-o`` a FIFO are
as easy to submit as ``-o train.out``. So a job's file is read only when:

- it is a regular file (checked on an ``O_PATH`` descriptor before anything opens it for
  reading: a FIFO, a device or a directory is never opened, so nothing blocks and no device
  driver sees an open), and the last component of the path is not a symbolic link;
- its real path (that of the descriptor, so a symlinked directory cannot swap it afterwards) is
  under one of the configured allowed roots, and not under ``/proc``, ``/sys`` or ``/dev``;
- the job's user could read it: the file's mode as it applies to the job's uid and groups (owner,
  then group, then other, as the kernel decides), and search permission on every directory above
  it — the job's access, never the service's own.

A file the operator's configuration names (a node's kernel log, the agents' telemetry) is
trusted evidence, so it is read only when no ordinary user could have written it: the file and
every directory above it are owned by root, the service's own account or a system account
(uid below ``UID_MIN`` of /etc/login.defs), and writable by no group or other that an ordinary
user is in (a sticky directory, such as /tmp, may be: nobody can replace another's file there)
(:func:`operator_file_problem`).

Anything else is *refused*: never read, and reported with the reason so that the evidence
records it. Reads run in a worker thread with a timeout (:func:`read_tail`), never on an event
loop. Linux only (``O_PATH`` and ``/proc/self/fd``), as Slurm is.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import pwd
import stat
from dataclasses import dataclass

from pydantic import BaseModel, Field

from relaunch.connectors.operator_files import operator_file_problem
from relaunch.models.config import JobOutputSettings
from relaunch.models.errors import RefusedPathError
from relaunch.models.scheduler import Job

log = logging.getLogger(__name__)
_MISMATCHES_SAID: set[tuple[str, int]] = set()


def _say_mismatch(job_id: str, name: str, uid: int, what: str) -> None:
    """Say once per name and uid that Slurm's user name is not this host's for the uid."""
    if (name, uid) not in _MISMATCHES_SAID and len(_MISMATCHES_SAID) < 1000:
        _MISMATCHES_SAID.add((name, uid))
        log.warning(
            "job %s: Slurm says user %r for uid %d, this host does not: %s",
            job_id,
            name[:64],
            uid,
            what,
        )


# Never job output, and reading them as the service would read the service's own state
# (/proc/self/environ) or a device.
_NEVER_UNDER = ("/proc", "/sys", "/dev")
_O_PATH = getattr(os, "O_PATH", 0)


@dataclass(frozen=True)
class JobIdentity:
    """Whose access a job file is checked against: the job's uid and all its groups."""

    uid: int
    gids: frozenset[int]

    def may(self, st: os.stat_result, bits: tuple[int, int, int]) -> bool:
        """Whether this identity has the (owner, group, other) permission ``bits`` on ``st``,
        deciding as the kernel does: the owner class alone for the owner, then the group."""
        if self.uid == 0:
            return True
        if st.st_uid == self.uid:
            return bool(st.st_mode & bits[0])
        if st.st_gid in self.gids:
            return bool(st.st_mode & bits[1])
        return bool(st.st_mode & bits[2])


_READ = (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)
_SEARCH = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)


def job_identity(job: Job) -> JobIdentity | None:
    """The job's uid and groups: Slurm's uid/gid, plus the user's supplementary groups where
    this host knows the user by that name and uid. None when Slurm gave no uid and the name is
    unknown here, or when a record gives uid 0 to a name this host does not call root (a job
    file is then refused: there is no one to check access for).

    Slurm's name is checked against this host's name for the uid: where they differ (another
    passwd, as in a container), the name's groups are not added (they would be another
    user's), and uid 0 under another name is no identity at all."""
    uid, gid, name = job.user_id, job.group_id, job.user
    groups_of = name
    if uid is not None and name:
        try:
            here = pwd.getpwuid(uid).pw_name
        except KeyError:
            here = None
        if uid == 0 and here != name:
            _say_mismatch(job.job_id, name, uid, "its files are not read")
            return None
        if here != name:
            groups_of = ""  # only a name this host gives the same uid brings its groups
            if here is not None:
                _say_mismatch(job.job_id, name, uid, "read with Slurm's uid and gid only")
    if uid is None and name:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        uid, gid = entry.pw_uid, gid if gid is not None else entry.pw_gid
    if uid is None:
        return None
    if gid is None:
        with contextlib.suppress(KeyError):
            gid = pwd.getpwuid(uid).pw_gid
    gids = {gid} if gid is not None else set()
    if groups_of and gid is not None:
        # A user unknown to this host (by that uid) keeps Slurm's primary group only.
        with contextlib.suppress(KeyError, OSError):
            gids.update(os.getgrouplist(groups_of, gid))
    return JobIdentity(uid=uid, gids=frozenset(gids))


class FileAccess(BaseModel):
    """How one file may be opened: as a job's (``owner`` set: every check of the module
    docstring) or as an operator-configured per-node file (``owner`` None: only a regular file,
    opened without blocking)."""

    owner_uid: int | None = None
    owner_gids: frozenset[int] = frozenset()
    allowed_roots: list[str] = Field(default_factory=lambda: ["/"])
    job_file: bool = True

    @classmethod
    def for_job(cls, job: Job, settings: JobOutputSettings) -> FileAccess:
        """The access rule for ``job``'s output files (refused wholesale when the job's uid is
        unknown)."""
        ident = job_identity(job)
        return cls(
            owner_uid=ident.uid if ident else None,
            owner_gids=ident.gids if ident else frozenset(),
            allowed_roots=settings.allowed_roots,
        )

    @classmethod
    def operator_file(cls) -> FileAccess:
        """A file the operator's configuration names (a node's kernel log, its telemetry)."""
        return cls(job_file=False)


def _real_path(fd: int, path: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return root == "/" or path == root or path.startswith(root + "/")


def _check_job_file(fd: int, path: str, st: os.stat_result, access: FileAccess) -> None:
    if access.owner_uid is None:
        raise RefusedPathError(f"{path}: the job's uid is unknown, so its access cannot be checked")
    real = _real_path(fd, path)
    if any(_under(real, d) for d in _NEVER_UNDER):
        raise RefusedPathError(f"{path}: resolves to {real}, never job output")
    roots = [os.path.realpath(r) for r in access.allowed_roots]
    if not any(_under(real, r) for r in roots):
        raise RefusedPathError(
            f"{path}: resolves to {real}, outside the allowed roots ({', '.join(roots)})"
        )
    ident = JobIdentity(uid=access.owner_uid, gids=access.owner_gids)
    if not ident.may(st, _READ):
        raise RefusedPathError(
            f"{path}: owned by uid {st.st_uid} gid {st.st_gid} with mode "
            f"{stat.S_IMODE(st.st_mode):04o}: the job's user (uid {ident.uid}) may not read it"
        )
    parent = os.path.dirname(real)
    while True:
        try:
            dst = os.stat(parent)
        except OSError as exc:
            raise RefusedPathError(f"{path}: cannot check directory {parent}") from exc
        if not ident.may(dst, _SEARCH):
            raise RefusedPathError(
                f"{path}: the job's user (uid {ident.uid}) may not enter directory {parent}"
            )
        if parent == "/":
            return
        parent = os.path.dirname(parent)


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def inode_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What a file's checks depend on: the same inode with the same owner and mode passes
    again (see ``checked`` of :func:`open_checked`)."""
    return (st.st_dev, st.st_ino, st.st_uid, st.st_gid, st.st_mode)


@dataclass
class FileOps:
    """File system operations made reading files (the watcher counts its logs' in
    ``relaunch_watch_file_ops_total``): opens (the ``O_PATH`` look and the read-only open are
    two), stats (``fstat``, and a new file's directories when its access is checked) and reads
    (``pread``). Each open is closed again; closes are not counted."""

    open: int = 0
    stat: int = 0
    read: int = 0

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.open, self.stat, self.read)


def open_checked(
    path: str, access: FileAccess, *, checked: tuple[int, int, int, int, int] | None = None
) -> int:
    """A read-only descriptor of ``path`` when ``access`` allows it (see the module docstring);
    FileNotFoundError when it does not exist, RefusedPathError when it may not be read.

    ``checked``: the :func:`inode_key` of a file that passed before; the same inode, owner and
    mode skip the path and directory checks (a tail reads the same file several times a second).
    Whether it is a regular file, and the final symbolic link, are checked on every open."""
    return open_checked_stat(path, access, checked=checked)[0]


def open_checked_stat(
    path: str,
    access: FileAccess,
    *,
    checked: tuple[int, int, int, int, int] | None = None,
    ops: FileOps | None = None,
) -> tuple[int, os.stat_result]:
    """:func:`open_checked`, with the descriptor's own ``fstat`` (taken once the file is open:
    the caller needs no other), counting what it does in ``ops``."""
    ops = ops if ops is not None else FileOps()
    if access.job_file and not os.path.isabs(path):
        raise RefusedPathError(f"{path}: not an absolute path")
    nofollow = os.O_NOFOLLOW if access.job_file else 0
    try:
        # O_PATH opens nothing (no FIFO wait, no device open): it only names the inode.
        ops.open += 1
        probe = os.open(path, _O_PATH | nofollow | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedPathError(f"{path}: a symbolic link") from exc
        if exc.errno == errno.ENOENT:
            raise FileNotFoundError(exc.errno, exc.strerror, path) from exc
        raise
    try:
        ops.stat += 1
        st = os.fstat(probe)
        if stat.S_ISLNK(st.st_mode):  # O_PATH|O_NOFOLLOW hands back the link itself
            raise RefusedPathError(f"{path}: a symbolic link")
        if not stat.S_ISREG(st.st_mode):
            raise RefusedPathError(f"{path}: {_kind(st)}, not a regular file")
        if inode_key(st) != checked:
            ops.stat += os.path.normpath(path).count("/")  # each directory above it
        if access.job_file and inode_key(st) != checked:
            _check_job_file(probe, path, st, access)
        elif not access.job_file and inode_key(st) != checked:
            problem = operator_file_problem(path, st, _real_path(probe, path))
            if problem:
                raise RefusedPathError(problem)
        ops.open += 1
        if not _O_PATH:
            fd = os.dup(probe)
        else:
            fd = os.open(f"/proc/self/fd/{probe}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(probe)
    try:
        ops.stat += 1
        reopened = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if (reopened.st_dev, reopened.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise RefusedPathError(f"{path}: changed while it was being opened")
    return fd, reopened


class TailRead(BaseModel):
    """What one read of a file gave: its text (empty when absent or refused), its size, and
    the reason it was refused, if it was."""

    text: str = ""
    size: int = 0
    refused: str | None = None


def tail_file(path: str, access: FileAccess, limit: int, start: int = 0) -> TailRead:
    """At most ``limit`` bytes from the end of the file, never before ``start`` (a cut first
    line is dropped). Blocking: call it in a thread (:func:`read_tail`)."""
    try:
        fd = open_checked(path, access)
    except RefusedPathError as exc:
        return TailRead(refused=exc.message)
    except OSError:
        return TailRead()
    try:
        size = os.fstat(fd).st_size
        begin = max(start if start <= size else 0, size - limit)
        chunks, offset = [], begin
        while offset < size:
            chunk = os.pread(fd, min(size - offset, 1 << 20), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
    except OSError:
        return TailRead()
    finally:
        os.close(fd)
    text = b"".join(chunks).decode(errors="replace")
    if begin not in (start, 0):
        text = text.split("\n", 1)[-1]
    return TailRead(text=text, size=size)


async def read_tail(
    path: str, access: FileAccess, limit: int, *, start: int = 0, timeout_s: float = 10.0
) -> TailRead:
    """:func:`tail_file` in a worker thread, given up after ``timeout_s`` (a hung network
    filesystem): the file then counts as refused for this read."""
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(tail_file, path, access, limit, start), timeout_s
        )
    except TimeoutError:
        return TailRead(refused=f"{path}: no answer within {timeout_s:g}s")


class FileEvidence(BaseModel):
    """A job's evidence read from files: its output (stdout then stderr), the size of its
    stdout file, each node's kernel-log text, and the job files refused (path → why)."""

    job_log: str = ""
    log_size: int = 0
    node_logs: dict[str, str] = Field(default_factory=dict)
    refused_paths: dict[str, str] = Field(default_factory=dict)


async def read_file_evidence(
    job: Job,
    *,
    start: int,
    node_log_pattern: str | None,
    settings: JobOutputSettings,
    log_limit: int,
    node_log_limit: int,
) -> FileEvidence:
    """The job's output files (stdout from byte ``start``) under the job's access rules, and
    each allocated node's kernel log (whole tail; the caller keeps what is this attempt's)."""
    access = await asyncio.to_thread(FileAccess.for_job, job, settings)
    out = FileEvidence()
    logs: list[str] = []
    if job.stdout_path:
        read = await read_tail(
            job.stdout_path, access, log_limit, start=start, timeout_s=settings.read_timeout_s
        )
        logs.append(read.text)
        out.log_size = read.size
        if read.refused:
            out.refused_paths[job.stdout_path] = read.refused
    if job.stderr_path and job.stderr_path != job.stdout_path:
        read = await read_tail(
            job.stderr_path, access, log_limit, timeout_s=settings.read_timeout_s
        )
        logs.append(read.text)
        if read.refused:
            out.refused_paths[job.stderr_path] = read.refused
    out.job_log = "\n".join(logs)
    if node_log_pattern:
        for node in job.nodes:
            read = await read_tail(
                node_log_pattern.format(node=node),
                FileAccess.operator_file(),
                node_log_limit,
                timeout_s=settings.read_timeout_s,
            )
            if read.text:
                out.node_logs[node] = read.text
            if read.refused:
                out.refused_paths[node_log_pattern.format(node=node)] = read.refused
    return out
