"""The catalog the gateway runs with, reloadable without a restart (#28 item 5).

:class:`LiveCatalog` is the :class:`~gateway.tasks.core.Catalog` every device runtime looks
tasks up in; :meth:`LiveCatalog.reload` loads the catalog path again, **validated first** (a
catalog that does not load changes nothing and its problems are returned), then swaps the
task table in one assignment (the event loop runs nothing in between: a lookup sees the old
table or the new one, never a mix) and bumps ``version``.

A lesson already running keeps the catalog version it started with: its instance holds the
frozen :class:`~gateway.tasks.core.TaskDef` it was started from (clips, durations, windows),
and a reload does not reach into it; only lessons started after the swap see the new version.
Stored lessons restored after a gateway restart take the catalog loaded then.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.tasks.core import Catalog
from gateway.tasks.core.loader import CatalogError, CatalogIssue, LoadResult, load_catalog

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    version: int  # 1 at start, +1 per successful reload
    digest: str  # sha256 of the loaded files' bytes (first 16 hex digits)
    tasks: int
    files: tuple[str, ...]
    loaded_at: float  # epoch seconds


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """``ok``: swapped (``version`` is the new one); else ``issues`` say why nothing changed."""

    ok: bool
    version: CatalogVersion
    issues: tuple[CatalogIssue, ...] = ()
    warnings: tuple[CatalogIssue, ...] = ()


def _digest(files: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for name in files:
        try:
            h.update(Path(name).read_bytes())
        except OSError:
            h.update(name.encode())
    return h.hexdigest()[:16]


class LiveCatalog(Catalog):
    def __init__(
        self,
        path: Path | str,
        loaded: LoadResult,
        *,
        on_swap: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__({task.key: task for task in loaded.catalog})
        self._path = Path(path)
        self._on_swap = on_swap
        self.current = CatalogVersion(
            1, _digest(loaded.files), len(loaded.catalog), loaded.files, time.time()
        )

    @classmethod
    def load(cls, path: Path | str) -> tuple[LiveCatalog, LoadResult]:
        """Load ``path`` (raises :class:`CatalogError` as ``load_catalog`` does)."""
        loaded = load_catalog(path)
        return cls(path, loaded), loaded

    def add_swap_listener(self, listener: Callable[[], None]) -> None:
        """Called after every swap (caches keyed by task are cleared there)."""
        previous = self._on_swap

        def both() -> None:
            previous()
            listener()

        self._on_swap = both

    async def reload(self) -> ReloadOutcome:
        """Load the catalog path again (file reads in a thread) and swap only if it loads."""
        try:
            loaded = await asyncio.to_thread(load_catalog, self._path)
        except CatalogError as exc:
            log.warning("catalog reload refused: %d problems", len(exc.issues))
            return ReloadOutcome(False, self.current, exc.issues)
        return self.swap(loaded)

    def swap(self, loaded: LoadResult) -> ReloadOutcome:
        """Put a loaded (validated) catalog in place, atomically for the event loop (the
        digest reads the few files again: it names what was loaded, so it need not be exact
        against a file changed in between)."""
        digest = _digest(loaded.files)
        self._tasks = {task.key: task for task in loaded.catalog}
        self.current = CatalogVersion(
            self.current.version + 1, digest, len(loaded.catalog), loaded.files, time.time()
        )
        self._on_swap()
        log.info("catalog version %d loaded (%s)", self.current.version, digest)
        return ReloadOutcome(True, self.current, (), loaded.warnings)
