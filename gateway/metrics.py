"""One metrics registry per gateway: Prometheus exposition and the retained MQTT snapshot.

Components declare their figures on the registry they are given (never a global one, so many
gateways can live in one test process). ``Quantiles`` keeps a bounded window of recent samples
for p50/p99/max figures such as timer lateness, which a Prometheus histogram cannot give exactly.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

NAMESPACE = "snlpgw"

# `*_created` timestamps are noise for ops and bloat the retained snapshot.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client


class Quantiles(Collector):
    """p50/p99/max over the last ``window`` samples (ring buffer: oldest sample dropped)."""

    def __init__(self, name: str, documentation: str, window: int = 2048) -> None:
        self.name = f"{NAMESPACE}_{name}"
        self.documentation = documentation
        self._samples: deque[float] = deque(maxlen=window)
        self.count = 0

    def observe(self, value: float) -> None:
        self._samples.append(value)
        self.count += 1

    def quantile(self, q: float) -> float:
        """Nearest-rank quantile of the window; NaN when empty."""
        if not self._samples:
            return math.nan
        ordered = sorted(self._samples)
        rank = max(0, math.ceil(q * len(ordered)) - 1)
        return ordered[rank]

    def summary(self) -> dict[str, float]:
        return {
            "p50": self.quantile(0.50),
            "p99": self.quantile(0.99),
            "max": max(self._samples) if self._samples else math.nan,
            "count": float(self.count),
        }

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=["stat"])
        for stat, value in self.summary().items():
            family.add_metric([stat], value)
        yield family

    def describe(self) -> Iterable[Metric]:
        return self.collect()


M = TypeVar("M", bound="Counter | Gauge | Histogram")


def _cached_labels(self: M, parent: Any, *values: object, **named: object) -> M:
    """``labels(...)`` memoized by its positional values: prometheus_client validates, locks
    and builds a key on every call, which cost 3-4 % of the gateway's CPU at 500 lessons. The
    cache holds the same children prometheus keeps (label values come from fixed sets,
    :mod:`gateway.labels`); nothing here removes a child, so it never goes stale."""
    if named:
        return parent.labels(self, *values, **named)  # type: ignore[no-any-return]
    cache: dict[tuple[object, ...], M] = self.__dict__.setdefault("_snlpgw_children", {})
    child = cache.get(values)
    if child is None:
        child = cache[values] = parent.labels(self, *values)
    return child


class _Counter(Counter):
    def labels(self, *values: object, **named: object) -> _Counter:
        return _cached_labels(self, Counter, *values, **named)

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        """``Counter.inc`` minus two calls of checks where they cannot fail (a child or an
        unlabelled counter, a non-negative amount, no exemplar): every hot-path count."""
        if exemplar is None and amount >= 0 and (not self._labelnames or self._labelvalues):
            self._value.inc(amount)
        else:
            super().inc(amount, exemplar)


class _Gauge(Gauge):
    def labels(self, *values: object, **named: object) -> _Gauge:
        return _cached_labels(self, Gauge, *values, **named)


class _Histogram(Histogram):
    def labels(self, *values: object, **named: object) -> _Histogram:
        return _cached_labels(self, Histogram, *values, **named)


class Metrics:
    """A registry plus typed constructors that prefix names with ``snlpgw_``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return _Counter(name, documentation, labels, namespace=NAMESPACE, registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return _Gauge(name, documentation, labels, namespace=NAMESPACE, registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
    ) -> Histogram:
        return _Histogram(
            name,
            documentation,
            labels,
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=buckets,
        )

    def quantiles(self, name: str, documentation: str, window: int = 2048) -> Quantiles:
        q = Quantiles(name, documentation, window)
        self.registry.register(q)
        return q

    def exposition(self) -> bytes:
        """Prometheus text format for ``GET /metrics``."""
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, float]:
        """Flat ``name{label="v"}`` → value map for the retained ops snapshot (NaN omitted)."""
        return dict(self._samples())

    def _samples(self) -> Iterator[tuple[str, float]]:
        for family in self.registry.collect():
            for sample in family.samples:
                if math.isnan(sample.value):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                key = f"{sample.name}{{{labels}}}" if labels else sample.name
                yield key, float(sample.value)
