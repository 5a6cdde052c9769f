"""A real sshd (Debian's openssh-server) on a free loopback port, in front of the local Slurm.

Generated host and client keys (ssh-keygen), ``PasswordAuthentication no``, root by key only,
and a known_hosts file for the client. The client key is authorized with a forced command that
records each command line sshd received (``$SSH_ORIGINAL_COMMAND``, NUL-separated) and then runs
it with ``/bin/sh -c``, exactly as sshd would through the login shell: tests can prove that an
action went through sshd, and what arguments it carried.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from relaunch.models.config import SshSettings

SSHD = "/usr/sbin/sshd"


def keygen(path: Path, comment: str) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        timeout=30,
    )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Sshd:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.host_key = keygen(root / "ssh_host_ed25519_key", "relaunch-test-host")
        self.client_key = keygen(root / "client_key", "relaunch-test-client")
        self.other_key = keygen(root / "other_key", "not-authorized")
        self.audit_log = root / "commands.log"
        self.log_file = root / "sshd.log"
        wrapper = root / "record-and-run"
        wrapper.write_text(
            "#!/bin/sh\n"
            f"printf '%s\\0' \"$SSH_ORIGINAL_COMMAND\" >> {shlex.quote(str(self.audit_log))}\n"
            'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
        )
        wrapper.chmod(0o755)
        pub = (root / "client_key.pub").read_text().strip()
        options = f'command="{wrapper}",no-pty,no-port-forwarding,no-agent-forwarding'
        (root / "authorized_keys").write_text(f"{options} {pub}\n")
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(self._known_line(root / "ssh_host_ed25519_key.pub"))
        # The same host name with a key that is not the server's (a changed or spoofed host).
        impostor = keygen(root / "impostor_host_key", "impostor")
        self.wrong_known_hosts = root / "known_hosts.wrong"
        self.wrong_known_hosts.write_text(self._known_line(impostor.with_suffix(".pub")))
        self.config = root / "sshd_config"
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {root / 'authorized_keys'}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    # The files live under /tmp (world-writable), which StrictModes rejects.
                    "StrictModes no",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def _known_line(self, pub: Path) -> str:
        kind, key = pub.read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {key}\n"

    def start(self) -> None:
        # sshd's privilege separation needs this directory (systemd creates it at boot).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        subprocess.run([SSHD, "-t", "-f", str(self.config)], check=True, timeout=30)
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-f", str(self.config), "-E", str(self.log_file)],
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
                raise RuntimeError(f"sshd did not start on port {self.port}:\n{tail}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop sshd and every connection it serves (as a host going away would)."""
        if self.proc is None:
            return
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                continue
        _, alive = psutil.wait_procs(procs, timeout=5)
        for proc in alive:
            proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def drop_connections(self) -> None:
        """Kill the processes serving established connections; sshd itself keeps listening."""
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children():
            child.kill()

    def settings(self, **overrides: Any) -> SshSettings:
        values: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": "root",
            "key_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "connect_timeout_s": 5.0,
            "command_timeout_s": 30.0,
        }
        return SshSettings(**{**values, **overrides})

    def commands(self) -> list[list[str]]:
        """Every command line sshd ran for the client key, split back into argv."""
        if not self.audit_log.exists():
            return []
        raw = self.audit_log.read_bytes().decode(errors="replace")
        return [shlex.split(line) for line in raw.split("\0") if line]

    def slurm_commands(self) -> list[list[str]]:
        """The Slurm argv of each command (without the ``timeout ... env VAR=...`` prefix)."""
        out = []
        for words in self.commands():
            if words[:1] == ["timeout"] and "env" in words:
                words = words[words.index("env") + 1 :]
                while words and "=" in words[0]:
                    words = words[1:]
            out.append(words)
        return out

    def accepted_logins(self) -> int:
        if not self.log_file.exists():
            return 0
        return self.log_file.read_text(errors="replace").count("Accepted publickey for root")


@pytest.fixture(scope="session")
def sshd() -> Iterator[Sshd]:
    """A real sshd for the whole session, as root on loopback; stopped at the end."""
    if shutil.which("ssh-keygen") is None or not os.path.exists(SSHD):
        pytest.fail("openssh-server and openssh-client are needed (scripts/install-deps.sh)")
    root = Path(tempfile.mkdtemp(prefix="relaunch-sshd-"))
    root.chmod(0o755)
    server = Sshd(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
