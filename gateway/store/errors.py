"""Store errors (carry the failing key where there is one)."""

from __future__ import annotations


class StoreError(Exception):
    """A store operation failed (SQLite error, closed store, dropped update)."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message if key is None else f"{message} [{key}]")
        self.key = key
