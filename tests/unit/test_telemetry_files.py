"""TelemetryTail: the watcher's incremental reader of a node's telemetry.jsonl."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from relaunch.connectors.telemetry import ChangeFilter, TelemetryTail, append_samples, pci_key
from relaunch.connectors.telemetry.samples import throttle_reasons
from relaunch.models.bundle import TelemetrySample, TelemetrySource

T0 = datetime(2026, 2, 20, 9, 0, tzinfo=UTC)


def sample(**fields: object) -> TelemetrySample:
    return TelemetrySample.model_validate({"node": "gpu-node-07", "gpu": 0, "time": T0, **fields})


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "nodes" / "gpu-node-07" / "telemetry.jsonl"
    tail = TelemetryTail(path)
    assert tail.read() == []  # no file yet
    append_samples(path, [sample(xid=79, source="nvml")])
    line = sample(ecc_dbe_volatile=2).model_dump_json(exclude_none=True) + "\n"
    with path.open("a") as f:
        f.write(line[:17])
    first = tail.read()
    assert [(s.xid, s.source) for s in first] == [(79, TelemetrySource.NVML)]
    assert tail.malformed == 0
    with path.open("a") as f:
        f.write(line[17:])
    assert [s.ecc_dbe_volatile for s in tail.read()] == [2]
    assert tail.read() == []


def test_malformed_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    path.write_text(
        '{"node": "n1", "xid": 48}\n'
        "not json at all\n"
        '{"gpu": 1}\n'  # no node
        "\n"
        '{"node": "n1", "gpu": 0, "ecc_dbe_volatile": 1, "future_field": true}\n'
    )
    tail = TelemetryTail(path)
    samples = tail.read()
    assert [(s.node, s.xid, s.ecc_dbe_volatile) for s in samples] == [
        ("n1", 48, None),
        ("n1", None, 1),
    ]
    assert tail.malformed == 2
    assert tail.last_error and "not a telemetry sample" in tail.last_error


def test_an_endless_line_is_one_malformed_line(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    tail = TelemetryTail(path)
    with path.open("a") as f:
        f.write('{"node": "n1", "junk": "' + "x" * (2 << 20))  # still no newline
    assert tail.read() == []
    with path.open("a") as f:
        f.write('"}\n')
    append_samples(path, [sample(xid=79)])
    assert [s.xid for s in tail.read()] == [79]
    assert tail.malformed == 1
    assert tail.last_error and "longer than" in tail.last_error


def test_truncated_or_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    append_samples(path, [sample(xid=13)])
    tail = TelemetryTail(path)
    assert len(tail.read()) == 1
    with path.open("a") as f:
        f.write('{"node": "n1", "xi')  # a partial line, then the file is replaced
    os.rename(path, tmp_path / "old.jsonl")
    append_samples(path, [sample(xid=79)])
    assert [s.xid for s in tail.read()] == [79]
    assert tail.truncations == 1
    assert tail.malformed == 0


def test_from_end_skips_history(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    append_samples(path, [sample(xid=13)])
    tail = TelemetryTail(path, from_end=True)
    assert tail.read() == []
    append_samples(path, [sample(xid=79)])
    assert [s.xid for s in tail.read()] == [79]


def test_old_readers_fields_still_round_trip() -> None:
    text = sample(xid=79, throttle=["hw_thermal"]).model_dump_json(exclude_none=True)
    again = TelemetrySample.model_validate_json(text)
    assert again.xid == 79 and again.throttle == ["hw_thermal"]
    assert TelemetrySample.model_validate({"node": "n1", "gpu": 2, "xid": 48}).source is None


def test_change_filter_treats_dcgm_last_xid_as_a_level() -> None:
    changes = ChangeFilter()
    dcgm = {"source": "dcgm", "xid": 79}
    assert changes.is_news(sample(**dcgm))
    assert not changes.is_news(sample(**dcgm))  # the same "last Xid" again is not news
    assert changes.is_news(sample(source="dcgm", xid=48))
    assert changes.is_news(sample(source="nvml"))
    assert changes.is_news(sample(source="nvml", xid=79))  # an NVML Xid is an event
    assert changes.is_news(sample(source="nvml", xid=79))
    assert changes.is_news(sample(source="nvml", ecc_dbe_volatile=0))  # a counter appeared
    assert not changes.is_news(sample(source="nvml", ecc_dbe_volatile=0))
    assert changes.is_news(sample(source="nvml", ecc_dbe_volatile=1))
    assert not changes.is_news(sample(source="nvml", ecc_dbe_volatile=0))  # driver reload
    assert changes.is_news(sample(source="nvml", ecc_dbe_volatile=0, remapped_rows_pending=True))


def test_pci_and_throttle_helpers() -> None:
    assert pci_key("00000000:07:00.0") == pci_key("PCI:0000:07:00") == "0000:07:00"
    assert pci_key("00000000:00:1B.0") == "0000:00:1b"
    assert pci_key("GPU-123") is None
    assert throttle_reasons(0x1 | 0x4 | 0x80) == ["sw_power_cap", "hw_power_brake"]
