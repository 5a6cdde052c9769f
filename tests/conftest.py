"""Shared fixtures. The real stack (Temporal, PostgreSQL, munge, Slurm) starts once per test
session, on free ports under a temporary directory, and only when a test asks for it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.models.errors import StackError

REPO = Path(__file__).resolve().parent.parent
# The Slurm release of the session's stack (`make test` runs the Slurm-facing tiers on each).
SLURM_RELEASE = os.environ.get("RELAUNCH_TEST_SLURM", "22.05")


# The groups that mostly wait (the PostgreSQL outage: 11 minutes, almost all of it waiting for the
# database to come back) go first, so that one worker waits them out from the start while the
# others run everything else (`make test`: three workers, --dist loadgroup).
FIRST_GROUPS = ("outage",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def group(item: pytest.Item) -> str:
        mark = item.get_closest_marker("xdist_group")
        return str(mark.args[0]) if mark and mark.args else ""

    items.sort(key=lambda item: group(item) not in FIRST_GROUPS)  # stable: order kept otherwise


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """A real local stack for the whole session: 4 Slurm nodes, short cred_expire. A start that
    fails (three sessions pick their free ports at the same moment; once, a 24.11 stack's nodes
    never registered) is said with its Slurm logs and tried once more, on new ports."""
    for attempt in (1, 2):
        root = Path(tempfile.mkdtemp(prefix="relaunch-test-"))
        instance = Stack(
            root / "state",
            StackConfig.with_free_ports(
                "life", cluster="test", cred_expire=10, services=False, slurm=SLURM_RELEASE
            ),
        )
        try:
            instance.up()
            break
        except StackError as exc:
            print(f"stack start {attempt} failed: {exc}", file=sys.stderr)
            for log in sorted(root.glob("state/**/slurm/log/*.log")):
                print(f"--- {log}\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
            instance.down()
            shutil.rmtree(root, ignore_errors=True)
            if attempt == 2:
                raise
    try:
        yield instance
    finally:
        instance.down()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_env(stack: Stack) -> dict[str, str]:
    """The environment a user's shell would have after `export SLURM_CONF=...`."""
    return {**os.environ, **stack.slurm_env}


@pytest.fixture
def scheduler(stack: Stack) -> SlurmCli:
    return stack.scheduler()


@pytest.fixture(scope="session")
def database_url(stack: Stack) -> str:
    return stack.database_url


@pytest.fixture
def pg(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def temporal_client(stack: Stack) -> AsyncIterator[Client]:
    client = await Client.connect(
        stack.temporal_address, namespace="default", data_converter=pydantic_data_converter
    )
    yield client


def sbatch(env: dict[str, str], *args: str, script: str | None = None) -> str:
    """Submit a job the way a user would, returning its id."""
    result = subprocess.run(
        ["sbatch", "--parsable", *args],
        input=script,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip().split(";")[0]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    # Slurm's daemons run as root and write job output here.
    tmp_path.chmod(0o755)
    return tmp_path
