"""`relaunch dev status`: each part of a local stack, its address and whether it is healthy."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from pydantic import BaseModel

from relaunch.devstack import accounting, procs, services
from relaunch.devstack.slurm import (
    ctld_pid,
    munge_healthy,
    restd_jwt_healthy,
    restd_local_healthy,
    slurmd_pid,
)
from relaunch.models.errors import RelaunchError

if TYPE_CHECKING:
    from relaunch.devstack.clusters import ClusterHome
    from relaunch.devstack.stack import Stack


class Part(BaseModel):
    """One process (or external service) of the stack, as `status` reports it."""

    name: str
    address: str
    healthy: bool
    pid: int | None = None
    detail: str = ""


class StackStatus(BaseModel):
    state_dir: str
    parts: list[Part]

    @property
    def healthy(self) -> bool:
        return all(p.healthy for p in self.parts)


def stack_status(stack: Stack) -> StackStatus:
    """Each part of ``stack``: Temporal, PostgreSQL, each cluster's Slurm, the services."""
    parts: list[Part] = []
    tpid = services.temporal_pid(stack.temporal_root)
    parts.append(
        Part(
            name="temporal",
            address=f"{stack.temporal_address} (UI {stack.temporal_ui})",
            pid=tpid,
            healthy=bool(tpid) and procs.port_open(stack.config.temporal_port),
        )
    )
    db_ok = stack.database_ok()
    parts.append(
        Part(
            name="postgres",
            address=stack.redacted_db(),
            pid=None if stack.config.database_url else services.postgres_pid(stack.postgres_root),
            healthy=db_ok,
            detail="external (RELAUNCH_DATABASE_URL)" if stack.config.database_url else "embedded",
        )
    )
    for home in stack.clusters:
        parts.extend(cluster_parts(stack, home))
    if db_ok:
        from relaunch.devstack.pause_status import pause_parts  # it imports Part from here

        parts.extend(pause_parts(stack))
    if stack.config.services:
        for name, home in stack.relaunch_services():
            pid = home.service_pid(name)
            parts.append(
                Part(
                    name=stack.service_label(name, home),
                    address=stack.console_url if name == "console" else f"cluster {home.name}",
                    pid=pid,
                    healthy=pid is not None,
                    detail=f"log {home.log_file(name)}",
                )
            )
    return StackStatus(state_dir=str(stack.state_dir), parts=parts)


def cluster_parts(stack: Stack, home: ClusterHome) -> list[Part]:
    """One cluster's Slurm daemons; named with the cluster where the stack has several."""
    slurm = home.slurm
    of = f" {home.name}" if len(stack.clusters) > 1 else ""
    parts = [
        Part(
            name=f"munged{of}",
            address=str(slurm.munge_socket),
            pid=procs.read_pid(slurm.munge_key.parent / "munged.pid"),
            healthy=munge_healthy(slurm),
        )
    ]
    cpid = ctld_pid(slurm)
    nodes_detail = ""
    nodes_by_name = {}
    if cpid:
        try:
            nodes_by_name = {
                n.name: n for n in asyncio.run(stack.scheduler(home.name).list_nodes())
            }
        except RelaunchError as exc:
            nodes_detail = str(exc)
    parts.append(
        Part(
            name=f"slurmctld{of}",
            address=f"127.0.0.1:{slurm.slurmctld_port}",
            pid=cpid,
            healthy=bool(cpid) and bool(nodes_by_name),
            detail=nodes_detail
            or f"Slurm {slurm.release} SLURM_CONF={slurm.conf} cred_expire={slurm.cred_expire}s",
        )
    )
    for node, port in zip(slurm.nodes, slurm.slurmd_ports, strict=True):
        pid = slurmd_pid(slurm, node)
        info = nodes_by_name.get(node)
        parts.append(
            Part(
                name=f"slurmd{of} {node}",
                address=f"127.0.0.1:{port}",
                pid=pid,
                healthy=bool(pid) and info is not None and info.responding,
                detail=info.display_state.lower() if info else "",
            )
        )
    parts.append(
        Part(
            name=f"slurmrestd{of} (local)",
            address=f"unix:{slurm.restd_socket}",
            pid=procs.read_pid(slurm.root / "run" / "slurmrestd-local.pid"),
            healthy=restd_local_healthy(slurm),
        )
    )
    parts.append(
        Part(
            name=f"slurmrestd{of} (jwt)",
            address=f"http://127.0.0.1:{slurm.restd_port}",
            pid=procs.read_pid(slurm.root / "run" / "slurmrestd-jwt.pid"),
            healthy=restd_jwt_healthy(slurm),
        )
    )
    if slurm.accounting:
        parts += [
            Part(
                name=f"mariadb{of} (accounting)",
                address=f"127.0.0.1:{accounting.db_port(slurm)}",
                pid=accounting.db_pid(slurm),
                healthy=accounting.db_pid(slurm) is not None,
            ),
            Part(
                name=f"slurmdbd{of}",
                address=f"127.0.0.1:{accounting.dbd_port(slurm)}",
                pid=accounting.dbd_pid(slurm),
                healthy=accounting.healthy(slurm),
            ),
        ]
    return parts
