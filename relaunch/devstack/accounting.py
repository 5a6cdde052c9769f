"""Slurm accounting for a local cluster (opt-in: ``StackConfig(accounting=True)``): a private
MariaDB and a slurmdbd, so that ``sacct`` answers as on a real cluster.

MariaDB (Debian's ``mariadb-server``) runs as a private instance: its own data directory,
unix socket and pid file under ``<slurm>/accounting/``, listening on 127.0.0.1 at a free port
(slurmdbd's StorageHost reaches it over TCP: the mysql plugin has no socket setting). It is
initialised once with ``mariadb-install-db``; slurmdbd logs in as ``slurm`` with a password
made for the stack, kept only in slurmdbd.conf (mode 0600, owned by SlurmUser=root).
slurmctld registers its cluster in the database itself when it first connects (no
``sacctmgr add cluster``). Jobs' comments are stored (``AccountingStoreFlags=job_comment``):
the watcher's catch-up reads the opt-in ``relaunch=on`` from them.

Accounting costs MariaDB's memory (115 MB resident, measured) and a few seconds of start-up
(about 5 s more on 24.11, whose slurmdbd asks MariaDB for TLS first and retries without);
default stacks keep it off.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from typing import TYPE_CHECKING

from relaunch.devstack import procs
from relaunch.models.errors import StackError

if TYPE_CHECKING:
    from pathlib import Path

    from relaunch.devstack.slurm import SlurmLayout

PACKAGES = ("slurmdbd", "slurm-wlm-mysql-plugin", "mariadb-server")
DATABASE = "slurm_acct_db"
DB_USER = "slurm"


def home(layout: SlurmLayout) -> Path:
    return layout.root / "accounting"


def _settings_file(layout: SlurmLayout) -> Path:
    return home(layout) / "accounting.json"


def settings(layout: SlurmLayout) -> dict[str, object]:
    """The accounting's ports and database password, chosen once and kept (mode 0600)."""
    path = _settings_file(layout)
    if path.exists():
        saved: dict[str, object] = json.loads(path.read_text())
        return saved
    home(layout).mkdir(parents=True, exist_ok=True)
    home(layout).chmod(0o700)
    chosen: dict[str, object] = {
        "db_port": procs.free_port(),
        "dbd_port": procs.free_port(),
        "password": secrets.token_urlsafe(18),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(chosen, out)
    return chosen


def dbd_port(layout: SlurmLayout) -> int:
    return int(str(settings(layout)["dbd_port"]))


def db_port(layout: SlurmLayout) -> int:
    return int(str(settings(layout)["db_port"]))


def conf_lines(layout: SlurmLayout) -> str:
    """What slurm.conf says when the cluster keeps accounting."""
    return (
        "AccountingStorageType=accounting_storage/slurmdbd\n"
        "AccountingStorageHost=127.0.0.1\n"
        f"AccountingStoragePort={dbd_port(layout)}\n"
        # For auth/munge this names the munge socket that talks to slurmdbd (AuthInfo's
        # socket is not used for it).
        f"AccountingStoragePass={layout.munge_socket}\n"
        "AccountingStoreFlags=job_comment\n"
    )


def dbd_conf(layout: SlurmLayout) -> Path:
    """slurmdbd.conf: beside slurm.conf, where slurmdbd looks for it (SLURM_CONF's folder)."""
    return layout.conf.with_name("slurmdbd.conf")


def require_binaries(layout: SlurmLayout) -> None:
    needed = ["mariadbd", "mariadb-install-db", "mariadb"]
    if layout.slurm_root is None:
        needed.append("slurmdbd")
    missing = [b for b in needed if not shutil.which(b)]
    if missing:
        raise StackError(
            f"Slurm accounting needs {', '.join(missing)}",
            hint="run `make deps` (installs " + " ".join(PACKAGES) + ")",
        )


def write_dbd_conf(layout: SlurmLayout) -> None:
    s, r = settings(layout), layout.root
    text = f"""# Written by `relaunch dev up`: the local cluster's accounting daemon.
AuthType=auth/munge
AuthInfo=socket={layout.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={s["dbd_port"]}
SlurmUser=root
LogFile={r}/log/slurmdbd.log
PidFile={r}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={s["db_port"]}
StorageUser={DB_USER}
StoragePass={s["password"]}
StorageLoc={DATABASE}
"""
    path = dbd_conf(layout)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)  # slurmdbd refuses a configuration others can read
    os.chown(path, 0, 0)


def _data(layout: SlurmLayout) -> Path:
    return home(layout) / "data"


def _socket(layout: SlurmLayout) -> Path:
    return home(layout) / "mysqld.sock"


def _db_pid_file(layout: SlurmLayout) -> Path:
    return home(layout) / "mysqld.pid"


def db_pid(layout: SlurmLayout) -> int | None:
    pid = procs.read_pid(_db_pid_file(layout))
    return pid if procs.pid_alive(pid) else None


def dbd_pid(layout: SlurmLayout) -> int | None:
    pid = procs.read_pid(layout.root / "run" / "slurmdbd.pid")
    return pid if procs.pid_alive(pid) else None


def healthy(layout: SlurmLayout) -> bool:
    return (
        db_pid(layout) is not None
        and dbd_pid(layout) is not None
        and procs.port_open(dbd_port(layout))
    )


def _sql(layout: SlurmLayout, statement: str) -> None:
    result = subprocess.run(
        ["mariadb", "--no-defaults", "-S", str(_socket(layout)), "-u", "root", "-e", statement],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0:
        raise StackError(f"MariaDB refused the accounting setup: {result.stderr.strip()[-300:]}")


def start(layout: SlurmLayout) -> None:
    """Start MariaDB and slurmdbd when they are not running (before slurmctld: it connects
    at start)."""
    s = settings(layout)
    log_dir = layout.root / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    (layout.root / "run").mkdir(parents=True, exist_ok=True)
    first = not (_data(layout) / "mysql").exists()
    if first:
        shutil.rmtree(_data(layout), ignore_errors=True)
        result = subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                "--user=root",
                f"--datadir={_data(layout)}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise StackError(
                f"mariadb-install-db failed: {(result.stderr or result.stdout).strip()[-300:]}"
            )
    if db_pid(layout) is None:
        _socket(layout).unlink(missing_ok=True)
        pid = procs.spawn(
            [
                "mariadbd",
                "--no-defaults",
                "--user=root",
                f"--datadir={_data(layout)}",
                f"--socket={_socket(layout)}",
                f"--port={s['db_port']}",
                "--bind-address=127.0.0.1",
                f"--pid-file={_db_pid_file(layout)}",
                f"--log-error={log_dir / 'mariadb.log'}",
                "--innodb-buffer-pool-size=32M",
                "--skip-log-bin",
            ],
            log=log_dir / "mariadb.out",
        )
        procs.wait_for(
            lambda: _socket(layout).exists() and procs.port_open(db_port(layout)),
            60,
            "MariaDB (accounting)",
            hint=f"see {log_dir / 'mariadb.log'}",
        )
        if db_pid(layout) is None:
            _db_pid_file(layout).write_text(str(pid))
    if first:
        password = str(s["password"]).replace("'", "")
        _sql(
            layout,
            f"create user if not exists '{DB_USER}'@'127.0.0.1' identified by '{password}';"
            f" grant all on {DATABASE}.* to '{DB_USER}'@'127.0.0.1';",
        )
    write_dbd_conf(layout)
    if dbd_pid(layout) is None:
        result = subprocess.run(
            ["slurmdbd"], capture_output=True, text=True, timeout=60, env=layout.process_env
        )
        if result.returncode != 0:
            raise StackError(
                f"slurmdbd did not start: {(result.stderr or result.stdout).strip()[-300:]}",
                hint=f"see {log_dir / 'slurmdbd.log'}",
            )
    procs.wait_for(
        lambda: procs.port_open(dbd_port(layout)),
        60,
        "slurmdbd",
        hint=f"see {log_dir / 'slurmdbd.log'}",
    )
