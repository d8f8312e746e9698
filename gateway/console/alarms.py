"""The last few ops alarms of each device, for the fleet page (a pure core; ``at_ms`` is given).

Bounded: at most ``per_device`` alarms a device (the newest) and ``max_devices`` devices; a new
device beyond that evicts the one whose last alarm is oldest. Alarms without a device are not
kept here (they are the gateway's, on the ops topic and in the metrics).
"""

from __future__ import annotations

from collections import deque


class RecentAlarms:
    def __init__(self, *, per_device: int = 5, max_devices: int = 1024) -> None:
        if per_device < 1 or max_devices < 1:
            raise ValueError("per_device and max_devices must be at least 1")
        self.per_device = per_device
        self.max_devices = max_devices
        self._by_device: dict[str, deque[tuple[str, int]]] = {}  # least recent first

    def __len__(self) -> int:
        return len(self._by_device)

    def raised(self, alarm: str, device: str | None, at_ms: int) -> None:
        if device is None:
            return
        found = self._by_device.pop(device, None)
        if found is None:
            if len(self._by_device) >= self.max_devices:
                del self._by_device[next(iter(self._by_device))]
            found = deque(maxlen=self.per_device)
        found.append((alarm[:64], at_ms))
        self._by_device[device] = found

    def of(self, device: str) -> tuple[str, ...]:
        """The device's alarm names, newest first."""
        return tuple(name for name, _ in reversed(self._by_device.get(device, ())))
