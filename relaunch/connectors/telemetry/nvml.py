"""GPU health from NVML (the ``pynvml`` module of ``nvidia-ml-py``).

:class:`NvmlCollector` reads, per GPU: Xid events (an NVML event set), uncorrected ECC counts,
remapped rows, retired pages, NVLink error counters and slowdown reasons, with the PCI bus id
and UUID that tie a sample to the kernel's and DCGM's view of the same GPU.

A sick GPU can hang NVML. Every call therefore runs on a daemon thread (one per GPU, one for
the event set, one for the library) and is awaited with its own timeout. A call that overruns
is reported in the sample's ``errors`` and leaves that GPU's thread marked stuck: later reads
of that GPU fail fast until the call returns, so one hung GPU never freezes the others.
A field NVML does not support on this GPU is simply absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from relaunch.connectors.telemetry.calls import CallThread, NvmlTimeoutError
from relaunch.connectors.telemetry.samples import pci_key, throttle_reasons
from relaunch.models.bundle import TelemetrySample, TelemetrySource
from relaunch.models.errors import RelaunchError

DEFAULT_CALL_TIMEOUT = 5.0
_MAX_EVENTS_PER_WAIT = 64


class NvmlUnavailableError(RelaunchError):
    """NVML cannot be used here: no driver, no library, no GPU, or it does not start."""


@dataclass
class GpuDevice:
    """One GPU as NVML enumerates it."""

    index: int
    handle: Any
    worker: CallThread
    uuid: str | None = None
    pci_bus_id: str | None = None
    events: bool = False
    nvlinks: list[int] | None = None  # links that answered, once probed
    notes: list[str] = field(default_factory=list)


class _GpuHung(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NvmlCollector:
    """Reads GPU health through an NVML module (``pynvml`` unless another is given).

    Use: ``await start()``, then :meth:`read` for a full sample per GPU and :meth:`wait_xid`
    for Xid events, and ``await close()`` at the end.
    """

    def __init__(
        self,
        node: str,
        nvml: Any = None,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.node = node
        self.call_timeout = call_timeout
        self._nvml = nvml
        self._clock = clock
        self._lib = CallThread("nvml-lib")
        self._events = CallThread("nvml-events")
        self._event_set: Any = None
        self._started = False
        self.devices: list[GpuDevice] = []

    @property
    def nv(self) -> Any:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise NvmlUnavailableError(
                    "NVML bindings missing (pip install nvidia-ml-py)"
                ) from exc
        return self._nvml

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Initialise NVML, enumerate the GPUs and register for Xid events.

        Raises NvmlUnavailableError when there is no usable GPU here."""
        nv = self.nv
        try:
            await self._lib.call("nvmlInit", nv.nvmlInit, self.call_timeout)
            self._started = True
            count = int(await self._lib.call("nvmlDeviceGetCount", nv.nvmlDeviceGetCount, 10))
        except nv.NVMLError as exc:
            raise _unavailable(nv, exc) from exc
        except NvmlTimeoutError as exc:
            raise NvmlUnavailableError(f"NVML does not answer ({exc})") from exc
        if count == 0:
            raise NvmlUnavailableError("no NVIDIA GPU here (NVML: no devices)")
        for index in range(count):
            device = GpuDevice(index, None, CallThread(f"nvml-gpu{index}"))
            self.devices.append(device)
            try:
                device.handle = await self._lib.call(
                    "nvmlDeviceGetHandleByIndex",
                    functools.partial(nv.nvmlDeviceGetHandleByIndex, index),
                    self.call_timeout,
                )
            except nv.NVMLError as exc:  # e.g. GpuIsLost: report the GPU, do not hide it
                device.notes.append(f"nvmlDeviceGetHandleByIndex: {_name(exc)}")
                continue
            except NvmlTimeoutError as exc:
                device.notes.append(exc.message)
                continue
            handle = device.handle
            device.uuid = _text(await self._optional(device, "nvmlDeviceGetUUID", handle))
            pci = await self._optional(device, "nvmlDeviceGetPciInfo", handle)
            device.pci_bus_id = _text(getattr(pci, "busId", None)) if pci is not None else None
        await self._register_events()

    async def _register_events(self) -> None:
        nv = self.nv
        try:
            self._event_set = await self._events.call(
                "nvmlEventSetCreate", nv.nvmlEventSetCreate, self.call_timeout
            )
        except (nv.NVMLError, NvmlTimeoutError):
            self._event_set = None
            return
        for device in self.devices:
            if device.handle is None:
                continue
            register = functools.partial(
                nv.nvmlDeviceRegisterEvents,
                device.handle,
                nv.nvmlEventTypeXidCriticalError,
                self._event_set,
            )
            try:
                await device.worker.call("nvmlDeviceRegisterEvents", register, self.call_timeout)
                device.events = True
            except nv.NVMLError as exc:
                if not self._absent(exc):
                    device.notes.append(f"nvmlDeviceRegisterEvents: {_name(exc)}")
            except NvmlTimeoutError as exc:
                device.notes.append(exc.message)

    async def close(self) -> None:
        """Free the event set and shut NVML down; skipped for anything still hung."""
        nv = self.nv
        if self._event_set is not None and self._events.idle:
            with contextlib.suppress(nv.NVMLError, NvmlTimeoutError):
                await self._events.call(
                    "nvmlEventSetFree",
                    functools.partial(nv.nvmlEventSetFree, self._event_set),
                    self.call_timeout,
                )
            self._event_set = None
        if self._started and self._lib.idle and all(d.worker.idle for d in self.devices):
            with contextlib.suppress(nv.NVMLError, NvmlTimeoutError):
                await self._lib.call("nvmlShutdown", nv.nvmlShutdown, self.call_timeout)
            self._started = False
        for worker in [self._lib, self._events, *(d.worker for d in self.devices)]:
            worker.close()

    # ------------------------------------------------------------------ reading

    def device_by_pci(self, bus_id_key: str) -> GpuDevice | None:
        """The GPU at a normalised PCI address (see ``samples.pci_key``), if any."""
        for device in self.devices:
            if device.pci_bus_id and pci_key(device.pci_bus_id) == bus_id_key:
                return device
        return None

    async def read(self) -> list[TelemetrySample]:
        """A full sample for every GPU, read concurrently (one thread per GPU)."""
        return list(await asyncio.gather(*(self._read_gpu(d) for d in self.devices)))

    async def _read_gpu(self, device: GpuDevice) -> TelemetrySample:
        nv = self.nv
        h = device.handle
        sample = self._sample(device)
        errors = list(device.notes)
        if h is None:
            sample.errors = errors or ["no NVML handle"]
            return sample
        try:
            vol = await self._get(
                device,
                errors,
                "nvmlDeviceGetTotalEccErrors(volatile)",
                nv.nvmlDeviceGetTotalEccErrors,
                h,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_VOLATILE_ECC,
            )
            sample.ecc_dbe_volatile = None if vol is None else int(vol)
            agg = await self._get(
                device,
                errors,
                "nvmlDeviceGetTotalEccErrors(aggregate)",
                nv.nvmlDeviceGetTotalEccErrors,
                h,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_AGGREGATE_ECC,
            )
            sample.ecc_dbe_aggregate = None if agg is None else int(agg)
            rows = await self._get(
                device, errors, "nvmlDeviceGetRemappedRows", nv.nvmlDeviceGetRemappedRows, h
            )
            if rows is not None:
                corr, unc, pending, failure = rows
                sample.remapped_rows_correctable = int(corr)
                sample.remapped_rows_uncorrectable = int(unc)
                sample.remapped_rows_pending = bool(pending)
                sample.remapped_rows_failure = bool(failure)
            pages = await self._get(
                device,
                errors,
                "nvmlDeviceGetRetiredPages",
                nv.nvmlDeviceGetRetiredPages,
                h,
                nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            )
            sample.retired_pages_dbe = None if pages is None else len(pages)
            pending_pages = await self._get(
                device,
                errors,
                "nvmlDeviceGetRetiredPagesPendingStatus",
                nv.nvmlDeviceGetRetiredPagesPendingStatus,
                h,
            )
            sample.retired_pages_pending = None if pending_pages is None else bool(pending_pages)
            sample.nvlink_errors = await self._nvlink_errors(device, errors)
            mask = await self._throttle_mask(device, errors)
            sample.throttle = None if mask is None else throttle_reasons(int(mask))
        except _GpuHung as hung:
            errors.append(hung.message)
        sample.errors = errors or None
        return sample

    async def _nvlink_errors(self, device: GpuDevice, errors: list[str]) -> int | None:
        nv = self.nv
        counters = [
            nv.NVML_NVLINK_ERROR_DL_REPLAY,
            nv.NVML_NVLINK_ERROR_DL_RECOVERY,
            nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            nv.NVML_NVLINK_ERROR_DL_CRC_DATA,
        ]
        probing = device.nvlinks is None
        links = range(int(nv.NVML_NVLINK_MAX_LINKS)) if probing else (device.nvlinks or [])
        answered: list[int] = []
        total: int | None = None
        for link in links:
            for counter in counters:
                value = await self._get(
                    device,
                    errors,
                    "nvmlDeviceGetNvLinkErrorCounter",
                    nv.nvmlDeviceGetNvLinkErrorCounter,
                    device.handle,
                    link,
                    counter,
                    absent=(nv.NVML_ERROR_INVALID_ARGUMENT,),
                )
                if value is None:
                    if counter == counters[0]:
                        break  # the link itself is not there
                    continue
                total = (total or 0) + int(value)
                if not answered or answered[-1] != link:
                    answered.append(link)
        if probing:
            device.nvlinks = answered
        return total

    async def _throttle_mask(self, device: GpuDevice, errors: list[str]) -> int | None:
        nv = self.nv
        newer = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None:
            try:
                return int(
                    await device.worker.call(
                        "nvmlDeviceGetCurrentClocksEventReasons",
                        functools.partial(newer, device.handle),
                        self.call_timeout,
                    )
                )
            except nv.NVMLError as exc:
                if exc.value != nv.NVML_ERROR_FUNCTION_NOT_FOUND:  # an older driver
                    if not self._absent(exc):
                        errors.append(f"nvmlDeviceGetCurrentClocksEventReasons: {_name(exc)}")
                    return None
            except NvmlTimeoutError as exc:
                raise _GpuHung(exc.message) from None
        mask = await self._get(
            device,
            errors,
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            nv.nvmlDeviceGetCurrentClocksThrottleReasons,
            device.handle,
        )
        return None if mask is None else int(mask)

    async def _get(
        self,
        device: GpuDevice,
        errors: list[str],
        label: str,
        fn: Callable[..., Any],
        *args: Any,
        absent: tuple[int, ...] = (),
    ) -> Any:
        """``fn(*args)`` on the GPU's thread; None when unsupported or failed (the failure is
        added to ``errors``); _GpuHung when the GPU's thread is stuck."""
        nv = self.nv
        try:
            return await device.worker.call(label, functools.partial(fn, *args), self.call_timeout)
        except nv.NVMLError as exc:
            if not self._absent(exc) and exc.value not in absent:
                errors.append(f"{label}: {_name(exc)}")
            return None
        except NvmlTimeoutError as exc:
            raise _GpuHung(exc.message) from None

    async def _optional(self, device: GpuDevice, name: str, *args: Any) -> Any:
        errors: list[str] = []
        try:
            value = await self._get(device, errors, name, getattr(self.nv, name), *args)
        except _GpuHung as hung:
            errors.append(hung.message)
            value = None
        device.notes.extend(errors)
        return value

    def _absent(self, exc: Any) -> bool:
        nv = self.nv
        return bool(exc.value in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND))

    def _sample(self, device: GpuDevice | None, gpu: int | None = None) -> TelemetrySample:
        return TelemetrySample(
            node=self.node,
            gpu=device.index if device else gpu,
            time=self._clock(),
            source=TelemetrySource.NVML,
            uuid=device.uuid if device else None,
            pci_bus_id=device.pci_bus_id if device else None,
        )

    # ------------------------------------------------------------------ events

    async def wait_xid(self, timeout: float) -> list[TelemetrySample]:
        """Xid events that arrive within ``timeout`` seconds (an empty list when none).

        Returns as soon as one arrives, with any others already queued. Raises
        NvmlTimeoutError when NVML does not return from the wait."""
        nv = self.nv
        if self._event_set is None or not any(d.events for d in self.devices):
            await asyncio.sleep(timeout)
            return []
        out: list[TelemetrySample] = []
        wait_ms = max(0, int(timeout * 1000))
        for _ in range(_MAX_EVENTS_PER_WAIT):
            wait = functools.partial(nv.nvmlEventSetWait_v2, self._event_set, wait_ms)
            try:
                data = await self._events.call(
                    "nvmlEventSetWait_v2", wait, wait_ms / 1000 + self.call_timeout
                )
            except nv.NVMLError as exc:
                if exc.value == nv.NVML_ERROR_TIMEOUT:
                    break
                raise
            wait_ms = 0  # collect what is already queued, then return
            if not int(data.eventType) & nv.nvmlEventTypeXidCriticalError:
                continue
            device = self._device_of(data.device)
            sample = self._sample(device)
            sample.xid = int(data.eventData)
            out.append(sample)
        return out

    def _device_of(self, handle: Any) -> GpuDevice | None:
        key = _handle_key(handle)
        for device in self.devices:
            if _handle_key(device.handle) == key:
                return device
        return None


def _handle_key(handle: Any) -> int:
    """What identifies a device handle: the address a ctypes handle points to, else the
    object itself (NVML hands out the same pointer for a device every time)."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return int(address) if address is not None else id(handle)


def _unavailable(nv: Any, exc: Any) -> NvmlUnavailableError:
    no_gpu = (
        nv.NVML_ERROR_LIBRARY_NOT_FOUND,
        nv.NVML_ERROR_DRIVER_NOT_LOADED,
        getattr(nv, "NVML_ERROR_GPU_NOT_FOUND", -1),
    )
    if exc.value in no_gpu:
        return NvmlUnavailableError(f"no NVIDIA GPU here (NVML: {exc})")
    return NvmlUnavailableError(f"NVML does not start (NVML: {exc})")


def _name(exc: Any) -> str:
    """An NVML error's name, without asking the (maybe hung) library for a string."""
    return type(exc).__name__.removeprefix("NVMLError_") or f"NVML error {exc.value}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
