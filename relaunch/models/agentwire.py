"""What ``relaunch agent --post`` sends and ``POST /intake/agent`` takes: JSON lines.

A line with ``"record": "kernel"`` is one of the kernel's own messages (facility LOG_KERN, read
from ``/dev/kmsg`` or journald's kernel transport), ``"record": "heartbeat"`` says the agent
is alive (or, with ``stopping``, that it stopped cleanly); any other line is a
:class:`~relaunch.models.bundle.TelemetrySample`. Every line names its node.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_KERNEL_TEXT = 2000


class KernelRecordLine(BaseModel):
    """One kernel message as the agent read it. The agent sends only facility 0: the
    receiver refuses any other, so that no user-space line is ever written as the kernel's."""

    model_config = ConfigDict(extra="forbid")

    record: Literal["kernel"] = "kernel"
    node: str
    source: Literal["kmsg", "journal"]
    facility: int = Field(ge=0, le=127)
    level: int = Field(ge=0, le=7)
    seq: int | None = Field(default=None, ge=0, description="/dev/kmsg's sequence number")
    usec: int | None = Field(default=None, ge=0, description="microseconds since boot")
    time: datetime = Field(description="when it was logged, by the node's wall clock")
    text: str = Field(max_length=MAX_KERNEL_TEXT)


class HeartbeatLine(BaseModel):
    """The agent is alive (sent every ``--heartbeat`` seconds, with or without news)."""

    model_config = ConfigDict(extra="forbid")

    record: Literal["heartbeat"] = "heartbeat"
    node: str
    time: datetime
    pid: int = Field(ge=0)
    stopping: bool = Field(default=False, description="the agent stopped cleanly")
    kernel_source: str | None = Field(default=None, max_length=16)
    kmsg_seq: int | None = Field(default=None, ge=0, description="the last record read")
    kernel_lost: int = Field(default=0, ge=0, description="records overwritten before read")
    dropped: int = Field(default=0, ge=0, description="lines the agent could not deliver")
