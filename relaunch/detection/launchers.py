"""A job's own launcher, from the lines it prints into the job's output: torchrun's elastic agent
(``torch/distributed/elastic/...`` in its log lines) or NVIDIA's NVRx ``ft_launcher``. Both
restart the job's workers themselves; a recovery gives them the time to (docs/spares.md).

The job's output is its user's text: what is read here only ever makes a recovery wait for that
job to train again, never blames or spares a node."""

from __future__ import annotations

import re

_FT_LAUNCHER = re.compile(r"nvidia_resiliency_ext|\bft_launcher\b")
_TORCHRUN = re.compile(r"torch/distributed/elastic/|\btorchelastic\b")


def launcher_of(text: str) -> str:
    """``ft_launcher``, ``torchrun`` or "" (none seen)."""
    if _FT_LAUNCHER.search(text):
        return "ft_launcher"
    if _TORCHRUN.search(text):
        return "torchrun"
    return ""
