"""The hostile-job tier's tools: a non-root Slurm user, a root-only secret, jobs submitted as
that user (``sbatch --uid`` from root, as a login node's sbatch would run them), and the checks
every attack ends with: no healthy node drained (a fresh ``sinfo``), a genuine fault still
caught (a real Xid 79 line in a node's kernel log), and no byte of the secret anywhere a person
or a program reads Relaunch's records."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from starlette.testclient import TestClient

from relaunch.devstack import faults
from relaunch.models.recovery import TERMINAL_STAGES, RecoveryStatus, Stage
from relaunch.models.scheduler import JobState
from tests.conftest import sbatch
from tests.integration.harness import Harness
from tests.integration.helpers import wait_job

HOSTILE_USER = "relaunch-mallory"
OTHER_USER = "relaunch-bob"
# Past planning: the verdict and the plan are made, the drains (if any) done or refused.
SETTLED = frozenset({Stage.ACTING, Stage.VERIFYING, Stage.AWAITING_APPROVAL, *TERMINAL_STAGES})
QUIET_JOB = '#!/bin/bash\necho "ready on $SLURMD_NODENAME"\nexec sleep 900\n'


def ensure_user(name: str) -> pwd.struct_passwd:
    """The local account ``name``, created (with a home) when missing. Idempotent, and safe
    against another session creating it at the same moment."""
    for _ in range(20):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
        made = subprocess.run(
            ["useradd", "-m", "-s", "/bin/bash", name], capture_output=True, text=True, timeout=60
        )
        # 9: it exists (made meanwhile); 10: /etc/passwd is locked by another useradd.
        if made.returncode not in (0, 9, 10):
            raise AssertionError(f"useradd {name}: {made.returncode} {made.stderr}")
        time.sleep(0.2)
    return pwd.getpwnam(name)


@dataclass
class Secret:
    """A root-owned 0600 file of the kind ``/etc/relaunch/env`` is: each line carries a
    unique token, and some lines look like the faults Relaunch reacts to, so that a reader that
    opens it on a job's behalf would carry the tokens into detections and verdicts."""

    path: Path
    tokens: list[str]

    @classmethod
    def create(cls, directory: Path) -> Secret:
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)  # like /etc/relaunch: anyone may look, only root may read
        tokens = [f"RLSECRET{secrets.token_hex(8)}" for _ in range(4)]
        path = directory / "env"
        path.write_text(
            f"RELAUNCH_CONSOLE_SECRET={tokens[0]}\n"
            f"RELAUNCH_DATABASE_URL=postgresql://relaunch:{tokens[1]}@db/relaunch\n"
            f"srun: error: Node failure on n1 {tokens[2]}\n"
            f"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name={tokens[3]}, GPU has fallen off the "
            "bus.\n"
        )
        path.chmod(0o600)
        os.chown(path, 0, 0)
        return cls(path, tokens)

    def leaks(self, data: str | bytes) -> list[str]:
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        return [t for t in self.tokens if t in text]


@dataclass
class Tier:
    """One harness (worker and watcher processes, one Relaunch cluster) the attacks of a test
    module run against, with the hostile user's directory and the console reading its audit
    trail."""

    h: Harness
    user: pwd.struct_passwd
    home: Path
    secret: Secret
    console: TestClient
    token: str
    fifos: list[Path] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.h.stack.slurm_env}

    # ------------------------------------------------------------------ jobs

    def submit(
        self,
        script: str,
        *args: str,
        user: pwd.struct_passwd | None = None,
        comment: str | None = None,
    ) -> str:
        """Submit ``script`` as ``user`` (the hostile one by default; root for a bystander),
        opted in to this tier's Relaunch cluster unless ``comment`` says otherwise. Its output
        goes to ``<home>/<job id>.out`` unless ``args`` name another."""
        who = self.user if user is None else user
        home = self.home if who.pw_uid == self.user.pw_uid else self.h.tmp / "bystander"
        home.mkdir(exist_ok=True)
        ident = [f"--uid={who.pw_uid}", f"--gid={who.pw_gid}"] if who.pw_uid else []
        out = [] if any(a.startswith(("-o", "--output")) for a in args) else [f"-o{home}/%j.out"]
        job_id = sbatch(
            self.env,
            *ident,
            f"--chdir={home}",
            *out,
            f"--comment={comment or self.opt_in}",
            *args,
            script=script,
        )
        self.h.jobs.append(job_id)
        return job_id

    @property
    def opt_in(self) -> str:
        return f"relaunch=on,relaunch_cluster={self.h.config.name}"

    def log(self, job_id: str, home: Path | None = None) -> str:
        path = (home or self.home) / f"{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    async def running(self, job_id: str, *, printed: str = "", timeout: float = 60) -> list[str]:
        """Wait until the job runs (and its output shows ``printed``); its nodes."""
        job = await wait_job(self.h.sched, job_id, JobState.RUNNING, timeout=timeout)
        deadline = time.monotonic() + timeout
        while printed and printed not in self.log(job_id):
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} never printed {printed!r}")
            await asyncio.sleep(0.3)
        return job.nodes

    def mkfifo(self, name: str) -> Path:
        path = self.home / name
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.mkfifo(path, 0o644)
        os.chown(path, self.user.pw_uid, self.user.pw_gid)
        self.fifos.append(path)
        return path

    def release_fifos(self) -> None:
        """Open each FIFO's ends for a moment, so that a slurmstepd blocked opening its write
        end goes on (and its job can end), and so does any reader blocked opening it."""
        for _ in range(5):  # a writer released from one FIFO may go on to wait on the next
            for path in self.fifos:
                with contextlib.suppress(OSError):
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                    time.sleep(0.2)
                    with contextlib.suppress(OSError):
                        os.read(fd, 1 << 16)
                    os.close(fd)
                with contextlib.suppress(OSError):  # and a reader waiting for a writer
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    # ------------------------------------------------------------- recoveries

    async def incident(self, job_id: str, timeout: float = 90) -> str:
        """The (first) incident Relaunch opened for this job."""
        deadline = time.monotonic() + timeout
        while True:
            rows = await self.h.audit.incidents(cluster=self.h.config.name, job_id=job_id)
            if rows:
                return min(rows, key=lambda r: r.attempt).id
            if time.monotonic() > deadline:
                raise AssertionError(f"no incident for job {job_id} after {timeout:.0f}s")
            await asyncio.sleep(0.3)

    async def settled(self, incident: str, timeout: float = 120) -> RecoveryStatus:
        """The recovery once its verdict and plan are made and any drain done or refused."""
        return await self.h.wait_stage(incident, set(SETTLED), timeout=timeout)

    @staticmethod
    def say(row: str, status: RecoveryStatus) -> None:
        """One line of what Relaunch decided (shown with ``pytest -rP``, for the report)."""
        v, p = status.verdict, status.plan
        line = f"row {row}: {status.incident_id} stage={status.stage.value}"
        if v:
            line += f" verdict={v.category.value} culprits={v.culprit_nodes}"
            line += f" corroboration={v.corroboration}"
        if p:
            line += f" plan={p.action.value} drain={p.drain_nodes} suspects={p.suspect_nodes}"
        print(line)

    # ------------------------------------------------------------------ checks

    def drained(self, words: tuple[str, ...] = ("drain",)) -> dict[str, str]:
        """Nodes drained or draining now (or whose state holds another of ``words``), with
        Slurm's reason: a fresh ``sinfo``."""
        out = subprocess.run(
            ["sinfo", "-N", "-h", "-o", "%N|%T|%E"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        rows = [line.split("|", 2) for line in out.splitlines() if line.strip()]
        return {n: r for n, st, r in rows if any(w in st.lower() for w in words)}

    async def drained_by(self, node: str, incident: str) -> bool:
        """Whether ``node`` is drained now with a reason that names ``incident``."""
        return incident in self.drained().get(node, "")

    def alive(self) -> None:
        """The worker and the watcher are still running."""
        for name in ("worker", "watch"):
            proc = self.h.procs.get(name)
            assert proc is not None and proc.poll() is None, (
                f"the {name} died: exit {proc.returncode if proc else '-'}; log:\n"
                + (self.h.tmp / f"{name}.log").read_text(errors="replace")[-3000:]
            )

    async def genuine_fault_is_caught(
        self, node: str, timeout: float = 120, *, drain: bool = True
    ) -> str:
        """A bystander's job on ``node``, then a real Xid 79 line in the node's kernel log:
        the recovery must name the node on the kernel log's word and (``drain``) drain it.
        Returns the incident."""
        job_id = self.submit(QUIET_JOB, "-w", node, "-n1", user=pwd.getpwuid(0))
        await wait_job(self.h.sched, job_id, JobState.RUNNING, timeout=60)
        incident = await self.inject_until_detected(node, job_id, timeout=timeout)
        stages = set(SETTLED) if drain else {*SETTLED, Stage.ISOLATING}
        status = await self.h.wait_stage(incident, stages, timeout=timeout)
        self.say("canary", status)
        assert status.verdict is not None, status
        assert status.verdict.culprit_nodes == [node], status.verdict
        assert status.verdict.corroboration.get(node), status.verdict.corroboration
        if drain:
            await self.h.until(
                lambda: self.drained_by(node, incident),
                f"{node} drained for {incident}",
                timeout=timeout,
            )
        return incident

    async def inject_until_detected(self, node: str, job_id: str, timeout: float = 90) -> str:
        """Append a real Xid 79 line to ``node``'s kernel log until the job has an incident
        (the watcher starts a node's log at its end, so a line written before it first looked
        is not news; one written again is the same detection and joins the same recovery)."""
        deadline = time.monotonic() + timeout
        while True:
            self.h.inject_xid(node)
            with contextlib.suppress(AssertionError):
                return await self.incident(job_id, timeout=6)
            if time.monotonic() > deadline:
                raise AssertionError(f"the Xid 79 on {node} was never detected for job {job_id}")

    def write_xid(self, node: str) -> None:
        self.write_kernel(node, faults.xid79_line(node))

    def write_kernel(self, node: str, text: str) -> None:
        """Append ``text`` (whole lines) to ``node``'s kernel-log source, as its driver would."""
        path = self.h.node_log(node)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(text)

    async def no_secret_anywhere(self) -> None:
        """No token of the secret file in any bundle, audit row, console page, the audit
        export, or the worker's and watcher's logs."""
        leaks: dict[str, list[str]] = {}
        for path in Path(self.h.config.bundle_dir).rglob("*"):
            if path.is_file() and (found := self.secret.leaks(path.read_bytes())):
                leaks[str(path)] = found
        with psycopg.connect(self.h.stack.database_url) as conn:
            for (row,) in conn.execute("select e::text from audit_events e").fetchall():
                if found := self.secret.leaks(str(row)):
                    leaks[f"audit row {str(row)[:120]}"] = found
        auth = {"authorization": f"Bearer {self.token}"}
        incidents = await self.h.audit.incidents(cluster=self.h.config.name, limit=1000)
        pages = ["/", "/nodes", "/jobs", "/audit", "/audit.json", "/audit.csv"]
        pages += [f"/incidents/{i.id}" for i in incidents]
        pages += [f"/audit.json?incident={i.id}" for i in incidents]
        for page in pages:
            r = self.console.get(page, headers=auth)
            assert r.status_code == 200, f"{page}: {r.status_code} {r.text[:300]}"
            if found := self.secret.leaks(r.text):
                leaks[f"console {page}"] = found
        for name in ("worker", "watch"):
            log = self.h.tmp / f"{name}.log"
            if log.exists() and (found := self.secret.leaks(log.read_bytes())):
                leaks[str(log)] = found
        assert not leaks, f"the secret leaked: {leaks}"
