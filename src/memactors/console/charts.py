"""The health page's charts: REQ-21's series over the last hour, sampled in-process.

A :class:`Sampler` reads the daemon's own counters (``Metrics.registry``, what ``/metrics`` exports)
every ``SAMPLE_SECONDS`` and keeps an hour of samples; each chart is what changed between two samples:
recalls by outcome, provider call latency (mean per interval, by operation) and results dropped by
REQ-9 reason. Drawn as small inline SVG (no script, no external asset); a restart starts the hour over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import pairwise
from typing import Any

import attrs
import trio
from markupsafe import Markup, escape

__all__ = ["SAMPLE_SECONDS", "WINDOW_SECONDS", "Chart", "Sampler"]

#: Seconds between two samples of the counters.
SAMPLE_SECONDS = 10.0
#: How far back the charts go.
WINDOW_SECONDS = 3600.0

_PALETTE = ("#2b6cb0", "#c05621", "#2f855a", "#9b2c2c", "#6b46c1", "#b7791f", "#2c7a7b", "#4a5568")


@attrs.frozen
class Chart:
    title: str
    unit: str
    #: (label, one value per interval), oldest first.
    series: tuple[tuple[str, tuple[float, ...]], ...]
    seconds: float
    #: What the legend sums up: "total" over the window (counts) or the "last" interval's value (a mean).
    summary: str = "total"

    @property
    def total(self) -> dict[str, float]:
        return {label: sum(values) for label, values in self.series}

    def svg(self, width: int = 320, height: int = 90) -> Markup:
        """The chart as inline SVG: one polyline per series, the peak written at the top left."""
        peak = max((v for _, values in self.series for v in values), default=0.0)
        title = escape(self.title)
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" '
                 f'height="{height}" viewBox="0 0 {width} {height}" aria-label="{title}">',
                 f'<rect x="0" y="0" width="{width}" height="{height}" class="chart-bg"/>']
        for i, (_label, values) in enumerate(self.series):
            if len(values) < 2:
                continue
            step = width / (len(values) - 1)
            scale = (height - 14) / peak if peak > 0 else 0.0
            points = " ".join(f"{x * step:.1f},{height - 2 - v * scale:.1f}" for x, v in enumerate(values))
            parts.append(f'<polyline fill="none" stroke="{_PALETTE[i % len(_PALETTE)]}" stroke-width="1.5" '
                         f'points="{points}"/>')
        parts.append(f'<text x="4" y="11" class="chart-peak">peak {escape(_short(peak))} {escape(self.unit)}</text>')
        parts.append("</svg>")
        return Markup("".join(parts))  # every interpolated text above is escaped or a number

    def legend(self) -> list[tuple[str, str, str]]:
        """(colour, label, the series' total over the window or its last value) per series."""
        return [(_PALETTE[i % len(_PALETTE)], label,
                 _short(sum(values)) if self.summary == "total" else f"last {_short(values[-1] if values else 0.0)}")
                for i, (label, values) in enumerate(self.series)]


def _short(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.2f}"


class Sampler:
    """An hour of the daemon's REQ-21 counters, sampled in-process."""

    def __init__(self, registry: Any, *, clock: Callable[[], float] = trio.current_time) -> None:
        self._registry = registry
        self._clock = clock
        self.points: deque[tuple[float, dict[str, float]]] = deque()

    def sample(self) -> None:
        now = self._clock()
        self.points.append((now, self._read()))
        while self.points and now - self.points[0][0] > WINDOW_SECONDS:
            self.points.popleft()

    async def run(self) -> None:
        while True:
            self.sample()
            await trio.sleep(SAMPLE_SECONDS)

    def _read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for family in self._registry.collect():
            for s in family.samples:
                if s.name == "harness_memory_recalls_total":
                    out[f"recalls|{s.labels.get('outcome', '?')}"] = s.value
                elif s.name == "harness_memory_results_dropped_total":
                    out[f"dropped|{s.labels.get('reason', '?')}"] = s.value
                elif s.name == "harness_memory_provider_duration_seconds_sum":
                    out[f"latency_sum|{s.labels.get('op', '?')}"] = s.value
                elif s.name == "harness_memory_provider_duration_seconds_count":
                    out[f"latency_count|{s.labels.get('op', '?')}"] = s.value
        return out

    def charts(self) -> list[Chart]:
        points = list(self.points)
        seconds = points[-1][0] - points[0][0] if len(points) > 1 else 0.0
        return [
            Chart("Recalls by outcome", "per interval", self._deltas(points, "recalls"), seconds),
            Chart("Provider latency (mean)", "ms", self._latency(points), seconds, summary="last"),
            Chart("Results dropped by reason", "per interval", self._deltas(points, "dropped"), seconds),
        ]

    @staticmethod
    def _labels(points: Iterable[tuple[float, dict[str, float]]], prefix: str) -> list[str]:
        return sorted({k.split("|", 1)[1] for _, p in points for k in p if k.startswith(prefix + "|")})

    def _deltas(self, points: list[tuple[float, dict[str, float]]], prefix: str
                ) -> tuple[tuple[str, tuple[float, ...]], ...]:
        out = []
        for label in self._labels(points, prefix):
            key = f"{prefix}|{label}"
            values = tuple(max(b[1].get(key, 0.0) - a[1].get(key, 0.0), 0.0) for a, b in pairwise(points))
            out.append((label, values))
        return tuple(out)

    def _latency(self, points: list[tuple[float, dict[str, float]]]) -> tuple[tuple[str, tuple[float, ...]], ...]:
        out = []
        for op in self._labels(points, "latency_count"):
            values = []
            for a, b in pairwise(points):
                count = b[1].get(f"latency_count|{op}", 0.0) - a[1].get(f"latency_count|{op}", 0.0)
                total = b[1].get(f"latency_sum|{op}", 0.0) - a[1].get(f"latency_sum|{op}", 0.0)
                values.append(1000.0 * total / count if count > 0 else 0.0)
            out.append((op, tuple(values)))
        return tuple(out)
