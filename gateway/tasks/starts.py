"""The admission line: control requests that start a lesson playing go at a bounded rate; a
device's later requests wait behind its waiting one, in order.

A ``start``, ``restart`` or ``resume`` request takes a slot of the
:class:`~gateway.tasks.core.admission.StartPacer`: now, and it is handled at once; later, and it
waits in arrival order; more than ``max_wait`` ahead, and it is refused ``overloaded`` at once
(counted). One the runtime would refuse anyway (unknown task, offline board, busy, nothing to
resume) takes no slot: it is handed over at once and refused with its own reason (asked only
while nothing of its device waits: behind something, what it will meet is not known yet).

While a device has a request waiting, its later requests follow that one (right after it, not
after every other device's slot): a ``stop`` sent after a ``start`` ends that start's lesson.
Board events are not held: they reach the runtime at once, as without the line (a waiting
``start`` meets the lesson as it is by then). When the device moves to another gateway
(:meth:`StartLine.release`) its waiting requests are refused ``overloaded``: the backend
retries and the new owner takes them.

Bounded: the pacer admits ``rate x max_wait`` slots ahead at most, and one device has at most
``PER_DEVICE`` requests in the line (past it a request is refused ``overloaded``, counted), so
neither a flood of requests for one device nor its own voice starts can fill the line every
other device's starts wait in. One loop timer, pointed at the head, drains it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.metrics import Metrics
from gateway.tasks.core import ControlAction, ControlRefusal, ControlReply, ControlRequest
from gateway.tasks.core.admission import AdmissionConfig, StartPacer

PACED = frozenset({ControlAction.START, ControlAction.RESTART, ControlAction.RESUME})
PER_DEVICE = 8  # requests of one device in the line at most

HandleRequest = Callable[[str, ControlRequest], None]
SendReply = Callable[[str, ControlReply], None]
WouldRefuse = Callable[[str, ControlRequest], bool]
MsClock = Callable[[], float]  # now, in ms on the loop's clock

log = logging.getLogger(__name__)


def loop_ms() -> float:
    """The running loop's clock in milliseconds (the line's timer runs on it)."""
    return asyncio.get_running_loop().time() * 1000.0


@dataclass(slots=True)
class _Entry:
    """A paced request at its slot, and its device's requests that came after it (handled right
    after it, in order)."""

    slot: float  # loop ms
    arrived: float
    device: str
    request: ControlRequest
    followers: list[ControlRequest] = field(default_factory=list)


class StartLine:
    def __init__(
        self,
        config: AdmissionConfig,
        *,
        handle: HandleRequest,
        reply: SendReply,
        would_refuse: WouldRefuse,
        metrics: Metrics,
        clock: MsClock = loop_ms,
    ) -> None:
        self._pacer = StartPacer(config)
        self._handle = handle
        self._reply = reply
        self._would_refuse = would_refuse
        self._clock = clock
        # Paced requests in slot order (the pacer's slots ascend); a device's later requests
        # follow its last entry.
        self._line: deque[_Entry] = deque()
        self._last: dict[str, _Entry] = {}  # device → its last entry in the line
        self._waiting: Counter[str] = Counter()  # device → its requests in the line
        self._timer: asyncio.TimerHandle | None = None
        self._m_paced = metrics.counter(
            "runtime_admission_paced", "Start, restart and resume requests that waited for a slot"
        )
        self._m_refused = metrics.counter(
            "runtime_admission_refused",
            "Control requests refused overloaded (no slot within the longest wait, a device "
            "with a full share of the line, or moved to another gateway while waiting)",
        )
        self._m_wait = metrics.quantiles(
            "runtime_admission_wait_ms", "How long a paced request waited for its slot (ms)"
        )
        depth = metrics.gauge("runtime_admission_waiting", "Requests in the admission line")
        depth.set_function(lambda: sum(self._waiting.values()))  # read when scraped

    def __contains__(self, device: str) -> bool:
        """Whether ``device`` has a request waiting."""
        return device in self._waiting

    def devices(self) -> list[str]:
        """The devices with a request waiting."""
        return list(self._waiting)

    def submit(self, device: str, request: ControlRequest) -> None:
        now = self._clock()
        waiting = self._waiting[device]
        if waiting >= PER_DEVICE:
            self._refuse(device, request, "too many requests for this device waiting")
            return
        paced = request.action in PACED and (waiting > 0 or not self._would_refuse(device, request))
        slot = self._pacer.reserve(now) if paced else now
        if slot is None:
            self._refuse(device, request, "too many lessons waiting for admission")
            return
        if not waiting and slot <= now:
            self._handle(device, request)
        elif paced:
            self._m_paced.inc()
            entry = _Entry(slot, now, device, request)
            self._line.append(entry)
            self._last[device] = entry
            self._waiting[device] += 1
            if self._timer is None:
                self._arm()
        else:
            self._last[device].followers.append(request)
            self._waiting[device] += 1

    def release(self, device: str) -> None:
        """The device is another gateway's now: its waiting requests are refused (retry)."""
        if device not in self._waiting:
            return
        mine = [e for e in self._line if e.device == device]
        self._line = deque(e for e in self._line if e.device != device)
        del self._waiting[device], self._last[device]
        for request in [r for e in mine for r in (e.request, *e.followers)]:
            self._refuse(device, request, "the device moved to another gateway")

    def close(self) -> None:
        """Forget what waits (the service is stopping) and cancel the timer."""
        self._line.clear()
        self._last.clear()
        self._waiting.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

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

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time() + (self._line[0].slot - self._clock()) / 1000.0
        self._timer = loop.call_at(at, self._drain)

    def _drain(self) -> None:
        self._timer = None
        now = self._clock()
        line = self._line
        while line and line[0].slot <= now:
            entry = line.popleft()
            device = entry.device
            self._m_wait.observe(now - entry.arrived)
            if self._last.get(device) is entry:  # nothing of it behind: it waits no more
                del self._last[device], self._waiting[device]
            else:
                self._waiting[device] -= 1 + len(entry.followers)
            for request in (entry.request, *entry.followers):
                try:
                    self._handle(device, request)
                except Exception:  # one request's failure must not strand the ones behind it
                    log.exception("admission: %s for %s failed", request.action, device)
        if line:
            self._arm()
