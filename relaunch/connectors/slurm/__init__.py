"""Slurm adapters: the CLI (local or over SSH) for reads and actions, slurmrestd for reads, and
in-cluster mode: slurmrestd for reads, hold, release and cancel, the CLI for the rest."""

from relaunch.connectors.slurm.base import Scheduler, SchedulerReader
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.composite import SlurmRestScheduler
from relaunch.connectors.slurm.rest import SlurmRest

__all__ = ["Scheduler", "SchedulerReader", "SlurmCli", "SlurmRest", "SlurmRestScheduler"]
