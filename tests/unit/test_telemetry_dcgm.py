"""dcgm-exporter's Prometheus text, parsed into samples; the scraper over real HTTP."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from relaunch.connectors.telemetry.dcgm import (
    DcgmError,
    DcgmScraper,
    ExpositionError,
    parse_exposition,
    samples_from_metrics,
)
from relaunch.models.bundle import TelemetrySource

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "telemetry"
V33 = (FIXTURES / "dcgm-exporter-3.3-t4.prom").read_text()
V48 = (FIXTURES / "dcgm-exporter-4.8-a100.prom").read_text()


def test_exposition_format_details() -> None:
    text = (
        "# HELP x help with \\n escape\n"
        "# TYPE x gauge\n"
        'x{a="q\\"uote",b="back\\\\slash",c="new\\nline",} 1.5e3 1712345678000\n'
        "y NaN\n"
        'z{gpu="0", UUID="GPU-1"} +Inf\n'
        "\n"
    )
    x, y, z = parse_exposition(text)
    assert x.labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}
    assert (x.value, x.timestamp_ms) == (1500.0, 1712345678000)
    assert math.isnan(y.value) and y.labels == {}
    assert z.labels == {"gpu": "0", "UUID": "GPU-1"} and z.value == math.inf


def test_malformed_line_names_its_number() -> None:
    with pytest.raises(ExpositionError, match="line 2"):
        parse_exposition('ok 1\nbad{gpu="0" 1\n')


def test_dcgm_exporter_3_with_hostname_label() -> None:
    samples = samples_from_metrics(parse_exposition(V33))
    by_gpu = {s.gpu: s for s in samples}
    assert set(by_gpu) == {0, 1}
    healthy, sick = by_gpu[0], by_gpu[1]
    assert healthy.node == sick.node == "ip-172-31-16-106"
    assert healthy.source is TelemetrySource.DCGM
    assert healthy.uuid == "GPU-0781f3bb-da15-f334-d5db-37b3f19542d0"
    assert healthy.pci_bus_id == "00000000:00:1B.0"
    assert healthy.xid is None  # 0 means "no Xid yet"
    assert healthy.nvlink_errors is None  # NaN: not reported
    assert healthy.throttle == []  # GPU idle only
    assert (sick.xid, sick.ecc_dbe_volatile, sick.ecc_dbe_aggregate) == (79, 2, 5)
    assert (sick.retired_pages_dbe, sick.retired_pages_pending) == (3, True)
    assert sick.throttle == ["sw_power_cap", "hw_thermal"]  # 0x44


def test_dcgm_exporter_4_8_with_lowercase_hostname_label() -> None:
    (sample,) = samples_from_metrics(parse_exposition(V48))
    assert sample.node == "vks-cluster-0-0-np1-worker-xtxww-xw4wp-wn7j2"
    assert sample.xid is None
    assert sample.remapped_rows_failure is True
    assert (sample.remapped_rows_uncorrectable, sample.remapped_rows_correctable) == (4, 0)


def test_node_given_by_the_scraper_wins_over_labels() -> None:
    samples = samples_from_metrics(parse_exposition(V33 + V48), node="gpu-node-07")
    assert {s.node for s in samples} == {"gpu-node-07"}
    # Two exporters' GPU 0 under one node name merge: the first UUID seen is kept.
    assert len(samples) == 2


def test_metrics_without_a_gpu_or_a_host_are_skipped() -> None:
    text = 'DCGM_FI_DEV_XID_ERRORS{UUID="GPU-1"} 79\nDCGM_FI_DEV_XID_ERRORS{gpu="0"} 79\n'
    assert samples_from_metrics(parse_exposition(text)) == []


class _Exporter(BaseHTTPRequestHandler):
    body = V33.encode()
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


async def test_scraper_over_http(exporter: str) -> None:
    samples = await DcgmScraper(exporter, node="gpu-node-07", timeout=5).scrape()
    assert [(s.node, s.gpu, s.xid) for s in samples] == [
        ("gpu-node-07", 0, None),
        ("gpu-node-07", 1, 79),
    ]


async def test_scraper_errors_are_typed(exporter: str) -> None:
    with pytest.raises(DcgmError, match="HTTP 404"):
        _Exporter.status = 404
        try:
            await DcgmScraper(exporter).scrape()
        finally:
            _Exporter.status = 200
    with pytest.raises(DcgmError, match="ConnectError"):
        await DcgmScraper("http://127.0.0.1:9/metrics", timeout=2).scrape()
