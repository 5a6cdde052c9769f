"""Slurm adapters: the CLI (local or over SSH) for reads and actions, slurmrestd for reads, and
in-cluster mode: slurmrestd for reads, hold, release and cancel, the CLI for the rest."""

import warnings

# cryptography 51 deprecates DSA, and asyncssh (ssh.py) names its DSA key types as it is
# imported: the warning would reach the stderr of every `relaunch` command, whatever it does.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")

from relaunch.connectors.slurm.base import Scheduler, SchedulerReader  # noqa: E402
from relaunch.connectors.slurm.commands import SlurmCli  # noqa: E402
from relaunch.connectors.slurm.composite import SlurmRestScheduler  # noqa: E402
from relaunch.connectors.slurm.rest import SlurmRest  # noqa: E402

__all__ = ["Scheduler", "SchedulerReader", "SlurmCli", "SlurmRest", "SlurmRestScheduler"]
