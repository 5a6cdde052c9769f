"""The NVML collector against a stand-in pynvml that raises the real NVMLError classes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pynvml
import pytest

from relaunch.connectors.telemetry.nvml import NvmlCollector, NvmlUnavailableError
from relaunch.connectors.telemetry.samples import ChangeFilter
from relaunch.models.bundle import TelemetrySource
from tests.support.fake_nvml import NOT_SUPPORTED, FakeGpu, FakeNvml, dgx


@pytest.fixture
async def fake() -> AsyncIterator[FakeNvml]:
    nvml = FakeNvml(dgx(2))
    yield nvml
    nvml.release()


async def started(fake: FakeNvml, timeout: float = 2.0) -> NvmlCollector:
    collector = NvmlCollector("gpu-node-07", fake, call_timeout=timeout)
    await collector.start()
    return collector


def test_the_stand_in_raises_the_real_error_classes() -> None:
    exc = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert type(exc) is pynvml.NVMLError_NotSupported
    fake = FakeNvml([FakeGpu(uuid="GPU-x", bus_id="00000000:07:00.0", remapped_rows=3)])
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetRemappedRows(fake.nvmlDeviceGetHandleByIndex(0))


async def test_first_read_is_a_full_sample_per_gpu(fake: FakeNvml) -> None:
    collector = await started(fake)
    samples = await collector.read()
    assert [s.gpu for s in samples] == [0, 1]
    first = samples[0]
    assert first.source is TelemetrySource.NVML
    assert first.uuid == "GPU-0c6a1f0e-5e8f-4c1b-9d7e-000000000000"
    assert first.pci_bus_id == "00000000:18:00.0"
    assert (first.ecc_dbe_volatile, first.ecc_dbe_aggregate) == (0, 0)
    assert (first.remapped_rows_pending, first.remapped_rows_failure) == (False, False)
    assert first.nvlink_errors == 0
    assert first.throttle == []
    assert first.errors is None
    await collector.close()
    assert not fake.initialised


async def test_not_supported_fields_are_absent_not_errors(fake: FakeNvml) -> None:
    fake.gpus[0].remapped_rows = NOT_SUPPORTED
    fake.gpus[0].nvlinks = NOT_SUPPORTED
    fake.gpus[0].ecc_volatile = -NOT_SUPPORTED
    collector = await started(fake)
    sample = (await collector.read())[0]
    dumped = sample.model_dump(exclude_none=True)
    for name in (
        "ecc_dbe_volatile",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "retired_pages_dbe",
        "retired_pages_pending",
        "nvlink_errors",
        "errors",
    ):
        assert name not in dumped
    assert dumped["ecc_dbe_aggregate"] == 0
    await collector.close()


async def test_xid_event_becomes_a_sample_for_that_gpu(fake: FakeNvml) -> None:
    collector = await started(fake)
    assert await collector.wait_xid(0.05) == []  # NVML's wait times out: no event, no sample
    fake.xid(1, 79)
    fake.xid(1, 45)
    events = await collector.wait_xid(2.0)
    assert [(s.gpu, s.xid) for s in events] == [(1, 79), (1, 45)]
    assert events[0].uuid == fake.gpus[1].uuid
    assert events[0].pci_bus_id == "00000000:28:00.0"
    await collector.close()


async def test_xid_wait_returns_as_soon_as_an_event_arrives(fake: FakeNvml) -> None:
    collector = await started(fake)
    loop = asyncio.get_running_loop()
    loop.call_later(0.1, fake.xid, 0, 48)
    began = time.monotonic()
    events = await collector.wait_xid(5.0)
    assert [s.xid for s in events] == [48]
    assert time.monotonic() - began < 2.0
    await collector.close()


async def test_counter_increase_and_remap_failure_are_news(fake: FakeNvml) -> None:
    collector = await started(fake)
    changes = ChangeFilter()
    assert len(changes.news(await collector.read())) == 2  # the first full sample
    assert changes.news(await collector.read()) == []  # nothing changed: nothing sent
    fake.gpus[1].ecc_volatile = 2
    news = changes.news(await collector.read())
    assert [(s.gpu, s.ecc_dbe_volatile) for s in news] == [(1, 2)]
    fake.gpus[0].remapped_rows = (0, 1, 0, 1)
    news = changes.news(await collector.read())
    assert [(s.gpu, s.remapped_rows_failure, s.remapped_rows_uncorrectable) for s in news] == [
        (0, True, 1)
    ]
    fake.gpus[0].clocks_event_reasons = 0x40 | 0x1  # HW thermal slowdown (+ idle, not news)
    news = changes.news(await collector.read())
    assert [(s.gpu, s.throttle) for s in news] == [(0, ["hw_thermal"])]
    fake.gpus[1].nvlinks[3][pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT] = 7  # type: ignore[index]
    news = changes.news(await collector.read())
    assert [(s.gpu, s.nvlink_errors) for s in news] == [(1, 7)]
    await collector.close()


async def test_older_driver_falls_back_to_throttle_reasons(fake: FakeNvml) -> None:
    fake.gpus[0].clocks_event_api = False
    fake.gpus[0].clocks_event_reasons = 0x8 | 0x80
    collector = await started(fake)
    sample = (await collector.read())[0]
    assert sample.throttle == ["hw_slowdown", "hw_power_brake"]
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.calls
    await collector.close()


async def test_nvlinks_probed_once_then_only_links_that_answered(fake: FakeNvml) -> None:
    collector = await started(fake)
    await collector.read()
    probed = fake.calls.count("nvmlDeviceGetNvLinkErrorCounter")
    fake.calls.clear()
    await collector.read()
    again = fake.calls.count("nvmlDeviceGetNvLinkErrorCounter")
    assert again == 2 * 18 * 4  # 2 GPUs, 18 links, 4 counters
    assert probed == again + 2 * (pynvml.NVML_NVLINK_MAX_LINKS - 18)
    await collector.close()


async def test_a_hung_call_times_out_and_is_reported_not_frozen(fake: FakeNvml) -> None:
    collector = await started(fake, timeout=0.3)
    fake.hang.add("nvmlDeviceGetRemappedRows")  # a sick GPU: NVML never returns
    began = time.monotonic()
    samples = await collector.read()
    assert time.monotonic() - began < 2.0
    assert all(s.errors == ["nvmlDeviceGetRemappedRows: no answer within 0.3s"] for s in samples)
    assert samples[0].ecc_dbe_volatile == 0  # what was read before the hang is kept
    again = await collector.read()  # the stuck thread is not queued behind: fail fast
    assert all(s.errors == ["NVML still hung in nvmlDeviceGetRemappedRows"] for s in again)
    fake.hang.clear()
    fake.release()
    await asyncio.sleep(0.1)
    healed = await collector.read()
    assert all(s.errors is None for s in healed)
    await collector.close()


async def test_a_lost_gpu_is_reported_and_the_others_still_read(fake: FakeNvml) -> None:
    collector = await started(fake)
    fake.gpus[1].lost = True
    first, second = await collector.read()
    assert first.errors is None
    assert second.errors and "nvmlDeviceGetTotalEccErrors(volatile): GpuIsLost" in second.errors
    await collector.close()


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "no NVIDIA GPU here (NVML: Driver Not Loaded)"),
        (
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "no NVIDIA GPU here (NVML: NVML Shared Library Not Found)",
        ),
    ],
)
async def test_no_gpu_is_unavailable(code: int, text: str) -> None:
    collector = NvmlCollector("n1", FakeNvml([], init_error=code))
    with pytest.raises(NvmlUnavailableError) as caught:
        await collector.start()
    assert caught.value.message == text


async def test_no_devices_is_unavailable() -> None:
    with pytest.raises(NvmlUnavailableError, match="no devices"):
        await NvmlCollector("n1", FakeNvml([])).start()


async def test_real_pynvml_here_has_no_gpu() -> None:
    with pytest.raises(NvmlUnavailableError, match="no NVIDIA GPU here"):
        await NvmlCollector("n1").start()
