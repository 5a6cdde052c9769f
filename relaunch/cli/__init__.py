"""The `relaunch` command line: the click group and its entry point (``python -m relaunch.cli``)."""

from relaunch.cli.main import cli, main

__all__ = ["cli", "main"]
