"""Relaunch keeps distributed training jobs running on GPU clusters."""

__version__ = "0.1.0"
