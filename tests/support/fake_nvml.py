"""A stand-in for the ``pynvml`` module on a machine without a GPU.

Same function names and signatures as nvidia-ml-py where Relaunch calls them, the real
constants, and the real exception classes: ``pynvml.NVMLError(code)`` builds the matching
``NVMLError_*`` subclass, exactly as the real bindings raise them. Event sets behave like
NVML's: a wait with a timeout raises ``NVMLError_Timeout`` when no event comes.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


def error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    """One GPU's state. A field set to an NVML error code makes its call raise that error."""

    uuid: str
    bus_id: str
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    remapped_rows: tuple[int, int, int, int] | int = (0, 0, 0, 0)
    retired_dbe: list[int] | int = field(default_factory=list)
    retired_pending: int = 0
    nvlinks: dict[int, list[int]] | int = field(default_factory=dict)  # link -> 5 counters
    clocks_event_reasons: int = 0
    clocks_event_api: bool = True  # False: the driver predates ClocksEventReasons
    register_events: int | None = None  # an error code, or None for OK
    lost: bool = False


class FakeHandle:
    def __init__(self, index: int) -> None:
        self.index = index


class _EventData:
    """The fields of ``c_nvmlEventData_t``."""

    def __init__(self, device: FakeHandle, event_type: int, data: int) -> None:
        self.device = device
        self.eventType = event_type
        self.eventData = data
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF


class _PciInfo:
    def __init__(self, bus_id: str) -> None:
        self.busId = bus_id
        self.busIdLegacy = bus_id
        parts = bus_id.split(":")
        self.domain = int(parts[0], 16)
        self.bus = int(parts[1], 16)
        self.device = int(parts[2].split(".")[0], 16)


class FakeNvml:
    """The module-like stand-in. ``hang`` names functions that block until ``release()``."""

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.init_error = init_error
        self.hang: set[str] = set()
        self.calls: list[str] = []
        self._released = threading.Event()
        self._cond = threading.Condition()
        self._events: deque[tuple[int, int]] = deque()
        self._registered: dict[int, int] = {}
        self._handles = [FakeHandle(i) for i in range(len(gpus))]
        self.initialised = False

    # test controls ---------------------------------------------------------------------

    def xid(self, index: int, xid: int) -> None:
        """The driver reports Xid ``xid`` on GPU ``index``."""
        with self._cond:
            self._events.append((index, xid))
            self._cond.notify_all()

    def release(self) -> None:
        self._released.set()

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if name in self.hang:
            self._released.wait()

    def _gpu(self, handle: FakeHandle) -> FakeGpu:
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    @staticmethod
    def _value(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise error(-value)
        return value

    # the pynvml API ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise error(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        self._enter("nvmlDeviceGetUUID")
        return self._gpu(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> _PciInfo:
        self._enter("nvmlDeviceGetPciInfo")
        return _PciInfo(self._gpu(handle).bus_id)

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeHandle, errorType: int, counterType: int
    ) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors")
        gpu = self._gpu(handle)
        if errorType != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if counterType == pynvml.NVML_VOLATILE_ECC:
            return int(self._value(gpu.ecc_volatile))
        if counterType == pynvml.NVML_AGGREGATE_ECC:
            return int(self._value(gpu.ecc_aggregate))
        raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRemappedRows(self, device: FakeHandle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows")
        rows = self._gpu(device).remapped_rows
        if isinstance(rows, int):
            raise error(rows)
        return rows

    def nvmlDeviceGetRetiredPages(self, device: FakeHandle, sourceFilter: int) -> list[int]:
        self._enter("nvmlDeviceGetRetiredPages")
        pages = self._gpu(device).retired_dbe
        if isinstance(pages, int):
            raise error(pages)
        if sourceFilter != pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            return []
        return list(pages)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: FakeHandle) -> int:
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus")
        gpu = self._gpu(device)
        if isinstance(gpu.retired_dbe, int):  # no page retirement on this GPU
            raise error(gpu.retired_dbe)
        return gpu.retired_pending

    def nvmlDeviceGetNvLinkErrorCounter(self, device: FakeHandle, link: int, counter: int) -> int:
        self._enter("nvmlDeviceGetNvLinkErrorCounter")
        links = self._gpu(device).nvlinks
        if isinstance(links, int):
            raise error(links)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS or link not in links:
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link][counter]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons")
        gpu = self._gpu(handle)
        if not gpu.clocks_event_api:
            raise error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return int(self._value(gpu.clocks_event_reasons))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons")
        return int(self._value(self._gpu(handle).clocks_event_reasons))

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, eventTypes: int, eventSet: Any) -> None:
        self._enter("nvmlDeviceRegisterEvents")
        gpu = self._gpu(handle)
        if gpu.register_events is not None:
            raise error(gpu.register_events)
        self._registered[handle.index] = self._registered.get(handle.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> _EventData:
        self._enter("nvmlEventSetWait_v2")
        with self._cond:
            deadline_ok = self._cond.wait_for(self._has_event, timeout=timeoutms / 1000)
            if not deadline_ok:
                raise error(pynvml.NVML_ERROR_TIMEOUT)
            index, xid = self._events.popleft()
        return _EventData(self._handles[index], pynvml.nvmlEventTypeXidCriticalError, xid)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")

    def _has_event(self) -> bool:
        while self._events and not (
            self._registered.get(self._events[0][0], 0) & pynvml.nvmlEventTypeXidCriticalError
        ):
            self._events.popleft()  # NVML delivers only what was registered
        return bool(self._events)


def dgx(count: int = 2) -> list[FakeGpu]:
    """``count`` healthy H100-like GPUs: ECC on, row remapping, no page retirement, 18 links."""
    return [
        FakeGpu(
            uuid=f"GPU-0c6a1f0e-5e8f-4c1b-9d7e-00000000000{i}",
            bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            retired_dbe=NOT_SUPPORTED,
            nvlinks={link: [0, 0, 0, 0, 0] for link in range(18)},
        )
        for i in range(count)
    ]
