"""The task service's control requests, with lesson starts admitted at a bounded rate.

A start (``start`` or ``restart``) asks the :class:`~gateway.tasks.core.admission.StartPacer`
for a slot: now, and it is handled at once; later, and it waits in arrival order until then;
more than ``max_wait`` ahead, and it is refused ``overloaded`` at once (counted). A device's
other requests never overtake its own waiting start (a ``stop`` sent after a ``start`` is
handled after it): they wait behind it in the same line; every other request is handled at
once. Bounded: the pacer admits ``rate x max_wait`` starts ahead at most, and one device has
at most ``PER_DEVICE`` requests in the line (past it the request is refused ``overloaded``),
so neither a flood of requests for one device nor one device's own voice starts can fill the
line that every other device's starts wait in. One loop timer, pointed at the head, drains it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter, deque
from collections.abc import Callable

from gateway.metrics import Metrics
from gateway.tasks.core import ControlAction, ControlRefusal, ControlReply, ControlRequest
from gateway.tasks.core.admission import AdmissionConfig, StartPacer

_STARTS = frozenset({ControlAction.START, ControlAction.RESTART})
_PACED = frozenset({*(a.value for a in _STARTS), "restore"})  # what a slot was reserved for
PER_DEVICE = 8  # requests of one device waiting in the line at most

log = logging.getLogger(__name__)

HandleRequest = Callable[[str, ControlRequest], None]
SendReply = Callable[[str, ControlReply], None]


class StartLine:
    def __init__(
        self, config: AdmissionConfig, *, handle: HandleRequest, reply: SendReply, metrics: Metrics
    ) -> None:
        self._pacer = StartPacer(config)
        self._handle = handle
        self._reply = reply
        # (slot, arrived, device, what it is, what to do) in arrival order. Starts' slots ascend
        # (the pacer's); a request queued behind its device's start has its arrival as its slot
        # and goes when it reaches the head.
        self._line: deque[tuple[float, float, str, str, Callable[[], None]]] = deque()
        self._waiting: Counter[str] = Counter()  # device → its requests in the line
        self._timer: asyncio.TimerHandle | None = None
        self._m_paced = metrics.counter(
            "runtime_starts_paced", "Lesson starts that waited for an admission slot"
        )
        self._m_refused = metrics.counter(
            "runtime_starts_overloaded",
            "Control requests refused overloaded: a start past the longest wait, or a device "
            "with PER_DEVICE requests in the line already",
        )
        self._m_wait = metrics.quantiles(
            "runtime_start_wait_ms", "How long a paced lesson start waited for its slot (ms)"
        )
        depth = metrics.gauge("runtime_starts_waiting", "Control requests in the admission line")
        depth.set_function(lambda: len(self._line))

    def submit(self, device: str, request: ControlRequest) -> None:
        now = asyncio.get_running_loop().time() * 1000.0
        start = request.action in _STARTS
        waiting = self._waiting[device]
        if waiting >= PER_DEVICE:
            self._refuse(device, request, "too many requests for this device waiting")
            return
        slot = self._pacer.reserve(now) if start else now
        if slot is None:
            self._refuse(device, request, "too many lesson starts waiting for admission")
            return
        if slot <= now and not waiting:
            self._handle(device, request)
            return
        if start:
            self._m_paced.inc()
        go = functools.partial(self._handle, device, request)
        self._enqueue(slot, now, device, request.action.value, go)

    def restore(self, device: str, go: Callable[[], None]) -> None:
        """Run ``go`` (a stored lesson resumed on an online board, which plays at once) at a
        start's slot, however far ahead: a herd of restores after a restart is spread like
        one of starts, and is never refused; the device's later requests wait behind it."""
        now = asyncio.get_running_loop().time() * 1000.0
        slot = self._pacer.reserve(now, always=True)
        assert slot is not None  # noqa: S101 - always=True reserves a slot
        if slot <= now and not self._waiting[device]:
            go()
            return
        self._m_paced.inc()
        self._enqueue(slot, now, device, "restore", go)

    def _enqueue(
        self, slot: float, now: float, device: str, what: str, go: Callable[[], None]
    ) -> None:
        self._line.append((slot, now, device, what, go))
        self._waiting[device] += 1
        if self._timer is None:
            self._arm()

    def _refuse(self, device: str, request: ControlRequest, why: str) -> None:
        self._m_refused.inc()
        self._reply(
            device,
            ControlReply(
                request.request_id,
                request.action.value,
                accepted=False,
                reason=ControlRefusal.OVERLOADED,
                detail=f"{why}; retry later",
            ),
        )

    def close(self) -> None:
        """Forget what waits (the service is stopping) and cancel the timer."""
        self._line.clear()
        self._waiting.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_at(self._line[0][0] / 1000.0, self._drain)

    def _drain(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time() * 1000.0
        line = self._line
        while line and line[0][0] <= now:
            _, arrived, device, what, go = line.popleft()
            self._waiting[device] -= 1
            if not self._waiting[device]:
                del self._waiting[device]
            if what in _PACED:
                self._m_wait.observe(now - arrived)
            try:
                go()
            except Exception:  # one request's failure must not strand the ones behind it
                log.exception("%s for %s failed", what, device)
        if line:
            self._arm()
