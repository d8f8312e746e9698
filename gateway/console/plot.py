"""Progress over time as a server-rendered SVG line chart (a pure core: numbers in, markup out).

One line per lesson: x is when each session of it started, y the number of sentences the child
finished in it. No verdicts: the chart shows what happened, not pass or fail (SPEC §2.4).
Labels are escaped; the caller passes the chart's accessible title.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 640, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 40, 190, 16, 28
LABEL_MAX = 22  # legend characters shown (the whole label in its tooltip): fits _RIGHT
# Colour-blind-safe (Okabe-Ito), each with at least 3:1 contrast on white.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#8A6D00", "#56606B")
MAX_SERIES = len(COLOURS)

Series = Mapping[str, Sequence[tuple[float, float]]]  # label -> [(x, y)] in x order


def progress_svg(series: Series, *, title: str, x_labels: tuple[str, str] = ("", "")) -> str:
    """An ``<svg role="img">`` of up to :data:`MAX_SERIES` lines (the rest left out)."""
    shown = list(series.items())[:MAX_SERIES]
    points = [p for _, line in shown for p in line]
    xs = [p[0] for p in points] or [0.0]
    ys = [p[1] for p in points] or [0.0]
    x0, x1 = min(xs), max(xs)
    y1 = max(*ys, 1.0)
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM

    def sx(x: float) -> float:
        return _LEFT + (plot_w / 2 if x1 == x0 else (x - x0) / (x1 - x0) * plot_w)

    def sy(y: float) -> float:
        return _TOP + plot_h - y / y1 * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" class="plot">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_LEFT + plot_w}" y2="{_TOP + plot_h}" '
        'stroke="#333"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + plot_h}" stroke="#333"/>',
        f'<text x="{_LEFT - 6}" y="{_TOP + 4}" text-anchor="end" font-size="12">{y1:g}</text>',
        f'<text x="{_LEFT - 6}" y="{_TOP + plot_h}" text-anchor="end" font-size="12">0</text>',
        f'<text x="{_LEFT}" y="{HEIGHT - 8}" font-size="12">{escape(x_labels[0])}</text>',
        f'<text x="{_LEFT + plot_w}" y="{HEIGHT - 8}" text-anchor="end" font-size="12">'
        f"{escape(x_labels[1])}</text>",
    ]
    for i, (label, line) in enumerate(shown):
        colour = COLOURS[i]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
        if len(line) > 1:
            out.append(
                f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>'
            )
        out.extend(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{colour}">'
            f"<title>{escape(label)}: {y:g}</title></circle>"
            for x, y in line
        )
        ly = _TOP + 14 + i * 20
        lx = WIDTH - _RIGHT + 12
        out.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{colour}"/>')
        short = label if len(label) <= LABEL_MAX else label[: LABEL_MAX - 1] + "…"
        out.append(
            f'<text x="{lx + 18}" y="{ly}" font-size="12"><title>{escape(label)}</title>'
            f"{escape(short)}</text>"
        )
    out.append("</svg>")
    return "".join(out)
