import pytest

from tests.integration.sshd import sshd  # noqa: F401 - the session's real sshd fixture


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
