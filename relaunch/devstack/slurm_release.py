"""Which Slurm release a local stack runs.

22.05 is this machine's own packages (Debian 12). 24.11 comes from Debian 13's packages,
installed with debootstrap into a root under the user's cache directory; its daemons and
clients run in that root through small wrappers (``<stack>/slurm/bin``), each in a private
mount namespace where the host's files appear at the same paths (home directories, /tmp, the
working directory, the project's virtual environment, /usr/local) and the host's users and
groups are the root's. A job submitted from the user's shell therefore sees what it would see
on the host, and the same job runs unchanged on either release.

The wrappers need root (mount namespaces, chroot), as the local stack's daemons already do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from relaunch.models.errors import StackError

HOST_RELEASE = "22.05"
ROOT_RELEASES = {"24.11": "trixie"}  # release -> the Debian suite whose packages carry it
RELEASES = (HOST_RELEASE, *ROOT_RELEASES)
DEFAULT_RELEASE = HOST_RELEASE
MIRROR_ENV = "RELAUNCH_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
JOB_LIBRARIES = """libffi8 libssl3t64 libsqlite3-0 libbz2-1.0 liblzma5 libreadline8t64 libncursesw6
libtinfo6 libuuid1 zlib1g libexpat1 libnsl2 libtirpc3t64 libgssapi-krb5-2 libcrypt1 libstdc++6
libgomp1 procps python3"""
ROOT_PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmrestd",
    "slurmdbd",
    "munge",
    "slurm-wlm-jwt-plugin",  # auth/jwt: slurmrestd's token mode
    "slurm-wlm-mysql-plugin",  # slurmdbd's storage: sacct
    # What a job run from the host's files needs inside the root: the shared libraries of the
    # host's Python and its extension modules (ctypes, ssl, sqlite3, ...), C++ and OpenMP
    # runtimes for torch, ps/kill, and a system python3 (jobs that name /usr/bin/python3).
    *JOB_LIBRARIES.split(),
)
# What a user, a test or Relaunch itself runs; each gets a wrapper of the same name.
COMMANDS = {
    "/usr/bin": [
        "sinfo",
        "squeue",
        "scontrol",
        "sbatch",
        "srun",
        "salloc",
        "scancel",
        "sacct",
        "sacctmgr",
        "sdiag",
        "sprio",
        "sshare",
        "sstat",
        "strigger",
        "sreport",
    ],
    "/usr/sbin": ["slurmctld", "slurmd", "slurmrestd", "slurmdbd"],
}
MARKER = "etc/relaunch-slurm-root"  # present inside a root: a wrapper run there runs directly
# Host directories that stay the root's own; every other top-level directory is the host's.
OWN = "bin boot dev etc lib lib32 lib64 libx32 proc run sbin sys usr var old_root lost+found"
# The root's files that are the host's (users, groups, names), read through /run/host-etc.
HOST_ETC = ("passwd", "group", "shadow", "gshadow", "hosts", "resolv.conf", "nsswitch.conf")

ENTER = """#!/bin/sh
# Written by `relaunch dev up`: run a Slurm {release} command inside its Debian root
# ({root}), in a private mount namespace where the host's files are at the same paths.
R={root}
[ -e /{marker} ] && exec "$@"
exec unshare --mount --propagation private -- /bin/sh -c '
R=$1; shift
for d in proc sys dev; do mount --rbind "/$d" "$R/$d" || exit 70; done
for d in /*; do
  case " {own} " in *" ${{d#/}} "*) continue;; esac
  [ -d "$d" ] && [ ! -L "$d" ] || continue
  mkdir -p "$R$d" && mount --bind "$d" "$R$d" || exit 70
done
mount --bind /usr/local "$R/usr/local" && mount --bind /etc "$R/run/host-etc" || exit 70
exec chroot "$R" /bin/sh -c "cd \\"\\$0\\" 2>/dev/null || cd /; exec \\"\\$@\\"" "$(pwd)" "$@"
' relaunch-slurm "$R" "$@"
"""


def check_release(release: str) -> str:
    if release not in RELEASES:
        raise StackError(
            f"unknown Slurm release {release!r}",
            hint=f"choose one of {', '.join(RELEASES)}",
        )
    return release


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "relaunch"


def root_dir(release: str) -> Path:
    return cache_dir() / f"slurm-{release}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_root(release: str, progress: Callable[[str], None] = lambda _: None) -> Path:
    """The Debian root that carries ``release``, built once into the cache (about 30 s and
    400 MB; concurrent callers wait for the first)."""
    suite = ROOT_RELEASES[release]
    root = root_dir(release)
    stamp = _stamp(release, suite)
    with _locked(cache_dir() / f"slurm-{release}.lock"):
        marker = root / MARKER
        if marker.exists() and marker.read_text() == stamp:
            return root
        if os.geteuid() != 0:
            raise StackError(
                f"Slurm {release} runs in a Debian root, which needs root to build and enter",
                hint="run `relaunch dev up` as root, or use --slurm " + HOST_RELEASE,
            )
        if not shutil.which("debootstrap"):
            raise StackError("debootstrap is not installed", hint="run `make deps`")
        mirror = os.environ.get(MIRROR_ENV, DEFAULT_MIRROR)
        work = root.with_name(root.name + ".building")
        shutil.rmtree(work, ignore_errors=True)
        progress(f"building a Debian {suite} root for Slurm {release} in {root} (once)")
        _run(
            ["debootstrap", "--variant=minbase", suite, str(work), mirror],
            f"debootstrap {suite}",
            timeout=900,
        )
        progress(f"installing Slurm {release} into it")
        _run(
            [
                "chroot",
                str(work),
                "sh",
                "-c",
                "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                "--no-install-recommends " + " ".join(ROOT_PACKAGES),
            ],
            f"installing Slurm {release}",
            timeout=900,
        )
        _adopt_host_identity(work)
        (work / MARKER).write_text(stamp)
        if root.exists():  # built with other packages: replaced whole
            progress(f"replacing the older root in {root}")
            shutil.rmtree(root)
        work.rename(root)
    return root


def _stamp(release: str, suite: str) -> str:
    """What a root holds; a root whose marker says otherwise is built again."""
    return f"Slurm {release} from Debian {suite}, for relaunch: {' '.join(ROOT_PACKAGES)}\n"


def _adopt_host_identity(root: Path) -> None:
    """The root's users, groups and host names become the host's (read live: a user added
    on the host later is known inside at once)."""
    (root / "run" / "host-etc").mkdir(parents=True, exist_ok=True)
    for name in HOST_ETC:
        target = root / "etc" / name
        target.unlink(missing_ok=True)
        target.symlink_to(f"/run/host-etc/{name}")
    (root / "usr" / "local").mkdir(parents=True, exist_ok=True)


def _run(argv: list[str], what: str, timeout: float) -> None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{what} took over {timeout:.0f} s") from exc
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-400:]
        raise StackError(f"{what} failed: {tail}", hint=f"set {MIRROR_ENV} to a reachable mirror")


def write_wrappers(bin_dir: Path, release: str, root: Path) -> None:
    """One wrapper per Slurm command in ``bin_dir``: put it first on PATH to use ``release``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    enter = bin_dir / ".enter"
    enter.write_text(ENTER.format(release=release, root=root, marker=MARKER, own=OWN))
    enter.chmod(0o755)
    for directory, names in COMMANDS.items():
        for name in names:
            wrapper = bin_dir / name
            wrapper.write_text(f'#!/bin/sh\nexec "{enter}" {directory}/{name} "$@"\n')
            wrapper.chmod(0o755)
