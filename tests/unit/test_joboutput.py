"""Reads of a job's output files: only regular files its own user may read, under the allowed
roots, never blocking (the files and directories are real; ownership needs root to set)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaunch.connectors.joboutput import FileAccess, read_file_evidence, read_tail, tail_file
from relaunch.connectors.logs import FileTail
from relaunch.models.config import JobOutputSettings
from relaunch.models.scheduler import Job

ALICE = 4242  # a uid and gid no account on the machine has
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is 0700, closed to other users)."""
    with tempfile.TemporaryDirectory(prefix="relaunch-joboutput-") as name:
        os.chmod(name, 0o755)
        yield Path(name)


def write(path: Path, text: str, *, mode: int = 0o644, owner: int | None = None) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def job_of(uid: int | None, path: Path | str, **fields: object) -> Job:
    return Job.model_validate(
        {"job_id": "7", "user_id": uid, "group_id": uid, "stdout_path": str(path), **fields}
    )


def access(uid: int | None, roots: list[str] | None = None) -> FileAccess:
    settings = JobOutputSettings(allowed_roots=roots or ["/"])
    return FileAccess.for_job(job_of(uid, "/dev/null"), settings)


@as_root
def test_the_job_users_own_file_is_read(shared: Path) -> None:
    log = write(shared / "train.out", "step=1\nstep=2\n", mode=0o600, owner=ALICE)
    read = tail_file(str(log), access(ALICE), 1 << 20)
    assert (read.text, read.size, read.refused) == ("step=1\nstep=2\n", 14, None)


@as_root
def test_a_root_secret_is_refused_for_another_users_job(shared: Path) -> None:
    secret = write(shared / "env", "DATABASE_PASSWORD=marker-5f1e\n", mode=0o600, owner=0)
    read = tail_file(str(secret), access(ALICE), 1 << 20)
    assert read.text == "" and read.refused is not None
    assert "may not read it" in read.refused and "marker" not in read.refused


@as_root
def test_the_owner_class_decides_even_when_others_may_read(shared: Path) -> None:
    # Mode 0044: everyone but the owner may read. The kernel refuses the owner; so do we.
    log = write(shared / "odd.out", "x\n", mode=0o044, owner=ALICE)
    assert tail_file(str(log), access(ALICE), 100).refused is not None
    assert tail_file(str(log), access(ALICE + 1), 100).text == "x\n"


@as_root
def test_a_readable_file_in_a_closed_directory_is_refused(shared: Path) -> None:
    closed = shared / "closed"
    closed.mkdir(mode=0o700)
    log = write(closed / "readable.out", "secret\n", mode=0o644, owner=0)
    read = tail_file(str(log), access(ALICE), 100)
    assert read.text == "" and read.refused and "may not enter directory" in read.refused


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    started = time.monotonic()
    read = asyncio.run(read_tail(str(fifo), access(0), 100, timeout_s=5))
    assert read.refused is not None and "FIFO" in read.refused
    tail = FileTail(fifo, access=access(0))
    assert tail.read() == b"" and tail.refused and "FIFO" in tail.refused
    assert FileTail(fifo).read() == b""  # an operator's file is never opened as a FIFO either
    assert time.monotonic() - started < 2


def test_a_device_is_refused() -> None:
    read = tail_file("/dev/zero", FileAccess.operator_file(), 100)
    assert read.text == "" and read.refused and "device" in read.refused


def test_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    target = write(tmp_path / "real.out", "hello\n")
    link = tmp_path / "link.out"
    link.symlink_to(target)
    read = tail_file(str(link), access(0), 100)
    assert read.text == "" and read.refused and "symbolic link" in read.refused
    assert tail_file(str(target), access(0), 100).text == "hello\n"


def test_a_symlinked_directory_is_judged_by_its_real_path(tmp_path: Path) -> None:
    jobs, elsewhere = tmp_path / "jobs", tmp_path / "elsewhere"
    jobs.mkdir()
    elsewhere.mkdir()
    write(elsewhere / "secret", "marker\n")
    (jobs / "sneaky").symlink_to(elsewhere, target_is_directory=True)
    read = tail_file(str(jobs / "sneaky" / "secret"), access(0, [str(jobs)]), 100)
    assert read.text == "" and read.refused and "outside the allowed roots" in read.refused
    # A root that is itself a symbolic link (/home -> /data/home) still admits its files.
    (tmp_path / "alias").symlink_to(elsewhere, target_is_directory=True)
    ok = tail_file(str(elsewhere / "secret"), access(0, [str(tmp_path / "alias")]), 100)
    assert ok.text == "marker\n"


def test_outside_the_allowed_roots_is_refused(tmp_path: Path) -> None:
    log = write(tmp_path / "train.out", "x\n")
    read = tail_file(str(log), access(0, ["/scratch", "/home"]), 100)
    assert read.text == "" and read.refused and "outside the allowed roots" in read.refused


def test_proc_is_never_read() -> None:
    read = tail_file("/proc/self/environ", access(0), 1 << 16)
    assert read.text == "" and read.refused and "never job output" in read.refused


def test_a_job_whose_uid_is_unknown_reads_nothing(tmp_path: Path) -> None:
    log = write(tmp_path / "train.out", "x\n")
    unknown = FileAccess.for_job(Job(job_id="7", user="no-such-user-here"), JobOutputSettings())
    read = tail_file(str(log), unknown, 100)
    assert read.text == "" and read.refused and "uid is unknown" in read.refused


def test_a_missing_file_is_empty_not_refused(tmp_path: Path) -> None:
    assert tail_file(str(tmp_path / "nope"), access(0), 100).model_dump() == {
        "text": "",
        "size": 0,
        "refused": None,
    }


def test_the_tail_starts_at_a_whole_line(tmp_path: Path) -> None:
    log = write(tmp_path / "train.out", "first line\nsecond\nthird\n")
    assert tail_file(str(log), access(0), 10).text == "third\n"
    assert tail_file(str(log), access(0), 100, start=11).text == "second\nthird\n"


def test_the_evidence_records_refused_paths_and_reads_the_rest(tmp_path: Path) -> None:
    out = write(tmp_path / "train.out", "NCCL WARN something\n")
    fifo = tmp_path / "err"
    os.mkfifo(fifo)
    job = job_of(0, out, stderr_path=str(fifo))
    files = asyncio.run(
        read_file_evidence(
            job,
            start=0,
            node_log_pattern=None,
            settings=JobOutputSettings(),
            log_limit=1 << 20,
            node_log_limit=1 << 20,
        )
    )
    assert files.job_log.startswith("NCCL WARN something")
    assert files.log_size == out.stat().st_size
    assert list(files.refused_paths) == [str(fifo)]


def test_allowed_roots_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="absolute"):
        JobOutputSettings(allowed_roots=["scratch"])


def test_a_tail_notices_when_its_file_is_closed_to_the_job(shared: Path) -> None:
    log = write(shared / "train.out", "step=1\n", mode=0o644)
    tail = FileTail(log, access=access(ALICE))
    assert tail.read() == b"step=1\n" and tail.refused is None
    log.chmod(0o600)  # root's own now: the job's user could no longer read what follows
    with log.open("a") as out:
        out.write("secret\n")
    assert tail.read() == b"" and tail.refused and "may not read it" in tail.refused


def test_a_relative_path_is_refused() -> None:
    read = tail_file("train.out", access(0), 100)
    assert read.text == "" and read.refused and "absolute" in read.refused
