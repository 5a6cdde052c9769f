"""The console's server-rendered SVG charts."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from relaunch.console.charts import column_chart, hbar_chart

SVG = "{http://www.w3.org/2000/svg}"


def test_bars_are_proportional_and_labelled() -> None:
    svg = str(hbar_chart([("gpu_hardware", 10), ("network", 5)], title="by category"))
    root = ET.fromstring(svg)  # well-formed XML
    widths = [float(r.get("width", "0")) for r in root.iter(f"{SVG}rect")]
    assert len(widths) == 2 and widths[0] == 2 * widths[1]
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "gpu_hardware" in texts and "10" in texts
    assert root.get("data-test") == "chart"


def test_labels_are_escaped() -> None:
    svg = str(hbar_chart([("<script>alert(1)</script>", 1)], title='a "quoted" <title>'))
    assert "<script>" not in svg
    ET.fromstring(svg)


def test_empty_charts_say_so() -> None:
    assert "no data" in str(hbar_chart([], title="nothing"))
    ET.fromstring(str(column_chart([], title="nothing")))


def test_columns_scale_to_the_highest_bucket() -> None:
    svg = str(column_chart([("a", 0), ("b", 4), ("c", 2)], title="t", height=140))
    root = ET.fromstring(svg)
    heights = [float(r.get("height", "0")) for r in root.iter(f"{SVG}rect")]
    assert heights[0] == 0 and heights[1] == 2 * heights[2] > 0
    assert re.search(r">max 4<", svg)
