from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from temporalio.client import Client

from relaunch.connectors.audit import AuditStore
from relaunch.devstack.stack import Stack
from relaunch.models.recovery import Policy
from tests.integration.harness import Harness
from tests.integration.sshd import sshd  # noqa: F401 - the session's real sshd fixture

MakeHarness = Callable[..., Harness]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
async def make_harness(
    stack: Stack, tmp_path: Path, temporal_client: Client
) -> AsyncIterator[MakeHarness]:
    """Recovery harnesses on the session's stack: ``make(policy, **config_updates)``. Each is
    stopped, and the nodes restored, when the test ends."""
    tmp_path.chmod(0o755)
    audit = await AuditStore.open(stack.database_url)
    made: list[Harness] = []

    def make(policy: Policy, **config: object) -> Harness:
        h = Harness(stack, tmp_path, temporal_client, audit, policy)
        if config:
            h.configure(**config)
        made.append(h)
        return h

    try:
        yield make
    finally:
        for h in made:
            await h.stop()
        if made:
            await made[0].restore_nodes()
        await audit.close()
