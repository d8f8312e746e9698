"""The admission line: lessons begin to play at a bounded rate; a device's later inputs wait
behind what it has waiting, in order.

What plays at once when handled takes a slot of the
:class:`~gateway.tasks.core.admission.StartPacer`: a ``start``, ``restart`` or ``resume``
request (:meth:`StartLine.submit`: now, and it is handled at once; later, and it waits in
arrival order; more than ``max_wait`` ahead, and it is refused ``overloaded`` at once, counted),
and a stored lesson resumed on an online board or a lesson paused by a board that went away
resuming as it comes back (:meth:`StartLine.restore`: however far ahead; never refused). A
request the runtime would refuse anyway (unknown task, offline board, busy, nothing to resume)
takes no slot: it is handed over at once and refused with its own reason.

A device with something waiting keeps its order: its later requests and board events
(:meth:`StartLine.after`) wait behind it, so a ``stop`` sent after a ``start`` ends that start's
lesson. Other devices are not held. When the device moves to another gateway
(:meth:`StartLine.release`), its waiting requests are refused ``overloaded`` (retry: the new
owner takes them) and the rest forgotten.

Bounded: the pacer lets ``rate x max_wait`` refusable slots be reserved ahead (restores add at
most one per stored instance), and one device has at most ``PER_DEVICE`` entries in the line
(past it a request is refused ``overloaded`` and an event dropped, both counted), so neither
a flood for one device nor its own voice starts can fill the line every other device's starts
wait in. One loop timer, pointed at the head, drains it.
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
PER_DEVICE = 8  # entries of one device in the line at most

HandleRequest = Callable[[str, ControlRequest], None]
SendReply = Callable[[str, ControlReply], None]
WouldRefuse = Callable[[str, ControlRequest], bool]

log = logging.getLogger(__name__)


Input = tuple[Callable[[], None], ControlRequest | None]  # what to run; the request it is


@dataclass(slots=True)
class _Entry:
    """A paced input at its slot, and its device's inputs that came after it (run right after
    it, in order: they wait for this device's slot, not for other devices')."""

    slot: float  # monotonic ms
    arrived: float
    device: str
    go: Callable[[], None]
    request: ControlRequest | None = None  # a control request (answered if released)
    followers: list[Input] = field(default_factory=list)


class StartLine:
    def __init__(
        self,
        config: AdmissionConfig,
        *,
        handle: HandleRequest,
        reply: SendReply,
        would_refuse: WouldRefuse,
        metrics: Metrics,
    ) -> None:
        self._pacer = StartPacer(config)
        self._handle = handle
        self._reply = reply
        self._would_refuse = would_refuse
        # Paced inputs in slot order (the pacer's slots ascend); a device's later inputs
        # follow its last entry.
        self._line: deque[_Entry] = deque()
        self._last: dict[str, _Entry] = {}  # device → its last entry in the line
        self._waiting: Counter[str] = Counter()  # device → its inputs in the line
        self._timer: asyncio.TimerHandle | None = None
        self._m_paced = metrics.counter(
            "runtime_admission_paced", "Lessons (starts, resumes, restores) that waited for a slot"
        )
        self._m_refused = metrics.counter(
            "runtime_admission_refused",
            "Control requests refused overloaded (no slot within the longest wait, a device "
            "with a full share of the line, or moved to another gateway while waiting)",
        )
        self._m_dropped = metrics.counter(
            "runtime_admission_dropped", "Board events dropped: their device's share was full"
        )
        self._m_wait = metrics.quantiles(
            "runtime_admission_wait_ms", "How long a paced lesson waited for its slot (ms)"
        )
        depth = metrics.gauge("runtime_admission_waiting", "Inputs waiting in the admission line")
        depth.set_function(lambda: sum(self._waiting.values()))  # read when scraped

    def __contains__(self, device: str) -> bool:
        """Whether ``device`` has something waiting (its inputs must wait behind it)."""
        return device in self._waiting

    def devices(self) -> list[str]:
        """The devices with something waiting."""
        return list(self._waiting)

    def submit(self, device: str, request: ControlRequest) -> None:
        now = _now()
        waiting = self._waiting[device]
        if waiting >= PER_DEVICE:
            self._refuse(device, request, "too many requests for this device waiting")
            return
        # A request the runtime refuses as it is now takes no slot (while nothing of its
        # device waits: behind something, what it will meet is not known yet).
        paced = request.action in PACED and (waiting > 0 or not self._would_refuse(device, request))
        slot = self._pacer.reserve(now) if paced else now
        if slot is None:
            self._refuse(device, request, "too many lessons waiting for admission")
            return
        if slot <= now and not waiting:
            self._handle(device, request)
            return
        go = lambda: self._handle(device, request)  # noqa: E731 - one closure per entry
        if paced:
            self._enqueue(_Entry(slot, now, device, go, request))
        else:
            self._follow(device, (go, request))

    def restore(self, device: str, go: Callable[[], None]) -> None:
        """Run ``go`` (a lesson that plays as it resumes) at a slot however far ahead: a herd
        of them after a restart or a broker outage is spread like one of starts, and never
        refused. It waits behind what its device already has in the line."""
        now = _now()
        slot = self._pacer.reserve(now, always=True)
        assert slot is not None  # noqa: S101 - always=True reserves a slot
        if slot <= now and device not in self._waiting:
            go()
            return
        self._enqueue(_Entry(slot, now, device, go))

    def after(self, device: str, go: Callable[[], None]) -> None:
        """Run ``go`` (the device's board event) now, or behind what the device has waiting;
        dropped, counted, when its share of the line is full."""
        waiting = self._waiting[device]
        if not waiting:
            go()
        elif waiting >= PER_DEVICE:
            self._m_dropped.inc()
        else:
            self._follow(device, (go, None))

    def release(self, device: str) -> None:
        """The device is another gateway's now: its waiting requests are refused (retry) and
        everything else of it forgotten."""
        if device not in self._waiting:
            return
        mine = [e for e in self._line if e.device == device]
        self._line = deque(e for e in self._line if e.device != device)
        del self._waiting[device], self._last[device]
        requests = [r for e in mine for r in (e.request, *(f for _, f in e.followers))]
        for request in requests:
            if request is not None:
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

    def _enqueue(self, entry: _Entry) -> None:
        self._m_paced.inc()
        self._line.append(entry)
        self._last[entry.device] = entry
        self._waiting[entry.device] += 1
        if self._timer is None:
            self._arm()

    def _follow(self, device: str, item: Input) -> None:
        self._last[device].followers.append(item)
        self._waiting[device] += 1

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_at(self._line[0].slot / 1000.0, self._drain)

    def _drain(self) -> None:
        self._timer = None
        now = _now()
        line = self._line
        while line and line[0].slot <= now:
            entry = line.popleft()
            device = entry.device
            self._m_wait.observe(now - entry.arrived)
            if self._last.get(device) is entry:  # nothing of it behind: it waits no more
                del self._last[device], self._waiting[device]
            else:
                self._waiting[device] -= 1 + len(entry.followers)
            for go in (entry.go, *(f for f, _ in entry.followers)):
                try:
                    go()
                except Exception:  # one input's failure must not strand the ones behind it
                    log.exception("admission: handling a waiting input of %s failed", device)
        if line:
            self._arm()


def _now() -> float:
    return asyncio.get_running_loop().time() * 1000.0
