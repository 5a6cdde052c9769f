"""Slurm adapters: the CLI (local or over SSH) for reads and actions, slurmrestd for reads."""

from relaunch.connectors.slurm.base import Scheduler, SchedulerReader
from relaunch.connectors.slurm.cli import SlurmCli
from relaunch.connectors.slurm.rest import SlurmRest

__all__ = ["Scheduler", "SchedulerReader", "SlurmCli", "SlurmRest"]
