"""Login rate limiting: a pure core (``now`` in seconds is an input).

Failed logins are counted per key (the client address, and the user name tried) in a fixed
window; a key with ``max_failures`` failures in its window is refused until the window ends.
A success clears the key. Bounded: at most ``max_keys`` keys; a new key beyond that evicts the
oldest window (a flood of addresses cannot grow the table).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Window:
    started: float
    failures: int


class LoginLimiter:
    def __init__(
        self, *, max_failures: int = 5, window_s: float = 60.0, max_keys: int = 4096
    ) -> None:
        if max_failures < 1 or window_s <= 0 or max_keys < 1:
            raise ValueError("max_failures, window_s and max_keys must be positive")
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_keys = max_keys
        self._windows: dict[str, _Window] = {}  # oldest window first

    def __len__(self) -> int:
        return len(self._windows)

    def blocked(self, keys: tuple[str, ...], now: float) -> bool:
        """True when any of ``keys`` used up its failures in its current window."""
        for key in keys:
            window = self._windows.get(key)
            if window is None:
                continue
            if now - window.started >= self.window_s:
                del self._windows[key]
            elif window.failures >= self.max_failures:
                return True
        return False

    def failed(self, keys: tuple[str, ...], now: float) -> None:
        for key in keys:
            window = self._windows.get(key)
            if window is None or now - window.started >= self.window_s:
                self._windows.pop(key, None)
                if len(self._windows) >= self.max_keys:
                    del self._windows[next(iter(self._windows))]
                self._windows[key] = _Window(now, 1)
            else:
                window.failures += 1

    def succeeded(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            self._windows.pop(key, None)
