"""Charts as server-rendered inline SVG: no JavaScript, escaped labels, fixed geometry."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markupsafe import Markup

BAR_COLOUR = "#3b6ea8"


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def hbar_chart(
    items: Sequence[tuple[str, float]], *, title: str, width: int = 420, test_id: str = "chart"
) -> Markup:
    """Horizontal bars, one per (label, value), longest first as given."""
    row, label_w, pad = 22, 120, 6
    height = max(1, len(items)) * row + 2 * pad
    top = max((v for _, v in items), default=0) or 1
    bar_w = width - label_w - 60
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="chart" '
        f'data-test="{escape(test_id)}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}"><title>{escape(title)}</title>'
    ]
    if not items:
        parts.append(f'<text x="{pad}" y="{pad + 14}" class="empty">no data</text>')
    for i, (label, value) in enumerate(items):
        y = pad + i * row
        w = bar_w * value / top
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{_num(w)}" height="{row - 6}" '
            f'fill="{BAR_COLOUR}"><title>{escape(label)}: {_num(value)}</title></rect>'
            f'<text x="{_num(label_w + w + 4)}" y="{y + 15}">{_num(value)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def column_chart(
    items: Sequence[tuple[str, float]],
    *,
    title: str,
    width: int = 560,
    height: int = 140,
    test_id: str = "chart",
) -> Markup:
    """Vertical columns over time buckets; the first and last labels are printed."""
    pad, axis = 6, 18
    top = max((v for _, v in items), default=0) or 1
    n = max(1, len(items))
    slot = (width - 2 * pad) / n
    plot_h = height - axis - pad
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="chart" '
        f'data-test="{escape(test_id)}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}"><title>{escape(title)}</title>'
        f'<line x1="{pad}" y1="{pad + plot_h}" x2="{width - pad}" y2="{pad + plot_h}" '
        f'stroke="#999"/>'
    ]
    for i, (label, value) in enumerate(items):
        h = plot_h * value / top
        x = pad + i * slot
        parts.append(
            f'<rect x="{_num(x + 1)}" y="{_num(pad + plot_h - h)}" '
            f'width="{_num(max(1.0, slot - 2))}" height="{_num(h)}" fill="{BAR_COLOUR}">'
            f"<title>{escape(label)}: {_num(value)}</title></rect>"
        )
    if items:
        parts.append(f'<text x="{pad}" y="{height - 4}">{escape(items[0][0])}</text>')
        parts.append(
            f'<text x="{width - pad}" y="{height - 4}" text-anchor="end">'
            f"{escape(items[-1][0])}</text>"
        )
        parts.append(
            f'<text x="{width - pad}" y="{pad + 10}" text-anchor="end">max {_num(top)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
