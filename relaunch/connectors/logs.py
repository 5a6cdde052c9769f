"""Log sources. ``FileTail`` reads only what was appended to a file since the last read."""

from __future__ import annotations

import os

DEFAULT_MAX_READ = 8 << 20


class FileTail:
    """Incremental reader of one file by byte offset.

    Each :meth:`read` returns the bytes appended since the previous one (at most ``max_read``
    per call; the rest comes next time). A file that does not exist yet reads as empty. A file
    that became shorter than the offset (truncated) or was replaced by another file (a new
    inode, e.g. rotation) is read again from its start, and ``truncations`` counts it. No
    threads and no open descriptor between calls: a read is an open, a stat and one pread.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, offset: int = 0, max_read: int = DEFAULT_MAX_READ
    ) -> None:
        if offset < 0 or max_read <= 0:
            raise ValueError("offset must be >= 0 and max_read > 0")
        self.path = os.fspath(path)
        self.offset = offset
        self.max_read = max_read
        self.truncations = 0
        self._identity: tuple[int, int] | None = None

    @classmethod
    def at_end(cls, path: str | os.PathLike[str], *, max_read: int = DEFAULT_MAX_READ) -> FileTail:
        """A tail that skips what the file holds now (from 0 if it does not exist yet)."""
        tail = cls(path, max_read=max_read)
        try:
            st = os.stat(tail.path)
        except FileNotFoundError:
            return tail
        tail.offset = st.st_size
        tail._identity = (st.st_dev, st.st_ino)
        return tail

    def read(self) -> bytes:
        """The bytes appended since the last read (``b""`` when none or no file)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""
        try:
            st = os.fstat(fd)
            identity = (st.st_dev, st.st_ino)
            replaced = self._identity is not None and identity != self._identity
            self._identity = identity
            if replaced or st.st_size < self.offset:
                self.offset = 0
                self.truncations += 1
            size = min(st.st_size - self.offset, self.max_read)
            if size <= 0:
                return b""
            data = os.pread(fd, size, self.offset)
            self.offset += len(data)
            return data
        finally:
            os.close(fd)
