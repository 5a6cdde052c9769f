"""Log sources. ``FileTail`` reads only what was appended to a file since the last read."""

from __future__ import annotations

import logging
import os

from relaunch.connectors.joboutput import FileAccess, FileOps, inode_key, open_checked_stat
from relaunch.models.errors import RefusedPathError

DEFAULT_MAX_READ = 8 << 20
log = logging.getLogger(__name__)


class FileTail:
    """Incremental reader of one file by byte offset.

    Each :meth:`read` returns the bytes appended since the previous one (at most ``max_read``
    per call; the rest comes next time). A file that does not exist yet reads as empty. A file
    that became shorter than the offset (truncated) or was replaced by another file (a new
    inode, e.g. rotation) is read again from its start, and ``truncations`` counts it. No
    threads and no open descriptor between calls: a read is two opens (the checked open of
    :func:`open_checked_stat`), two ``fstat`` and one ``pread`` when the file grew; ``ops``
    counts them (:class:`FileOps`).

    Only regular files are opened, never blocking (a FIFO or a device reads as refused). With
    ``access`` from :meth:`FileAccess.for_job` a job's file is also checked as the job's user
    (see relaunch.connectors.joboutput); a refused file reads as empty, and ``refused`` says
    why until a later read succeeds.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        offset: int = 0,
        max_read: int = DEFAULT_MAX_READ,
        access: FileAccess | None = None,
    ) -> None:
        if offset < 0 or max_read <= 0:
            raise ValueError("offset must be >= 0 and max_read > 0")
        self.path = os.fspath(path)
        self.offset = offset
        self.max_read = max_read
        self.access = access or FileAccess.operator_file()
        self.truncations = 0
        self.refused: str | None = None
        self._identity: tuple[int, int] | None = None
        self._checked: tuple[int, int, int, int, int] | None = None
        self.ops = FileOps()

    @classmethod
    def at_end(
        cls,
        path: str | os.PathLike[str],
        *,
        max_read: int = DEFAULT_MAX_READ,
        access: FileAccess | None = None,
    ) -> FileTail:
        """A tail that skips what the file holds now (from 0 if it does not exist yet)."""
        tail = cls(path, max_read=max_read, access=access)
        try:
            fd, st = tail._open()
        except (OSError, RefusedPathError):
            return tail
        os.close(fd)
        tail.offset = st.st_size
        tail._identity = (st.st_dev, st.st_ino)
        return tail

    def _open(self) -> tuple[int, os.stat_result]:
        fd, st = open_checked_stat(self.path, self.access, checked=self._checked, ops=self.ops)
        self._checked = inode_key(st)
        return fd, st

    def read(self) -> bytes:
        """The bytes appended since the last read (``b""`` when none, no file, or refused)."""
        try:
            fd, st = self._open()
        except FileNotFoundError:
            return b""
        except RefusedPathError as exc:
            if self.refused is None:
                log.warning("refused to read a log file", extra={"reason": exc.message})
            self.refused = exc.message
            return b""
        self.refused = None
        try:
            identity = (st.st_dev, st.st_ino)
            replaced = self._identity is not None and identity != self._identity
            self._identity = identity
            if replaced or st.st_size < self.offset:
                self.offset = 0
                self.truncations += 1
            size = min(st.st_size - self.offset, self.max_read)
            if size <= 0:
                return b""
            self.ops.read += 1
            data = os.pread(fd, size, self.offset)
            self.offset += len(data)
            return data
        finally:
            os.close(fd)
