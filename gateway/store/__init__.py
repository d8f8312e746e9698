"""Storage of task instances and steps (SQLite or PostgreSQL), the task HTTP API, the results
HTTP API (``ResultsApi``, built by the composition root with the archive's link signer; its read
model: ``results.py``), the manager reporter.

Wiring (composition root)::

    parts = build_store_components(ctx)          # routes and health registered on ctx
    recorder = StoreRecorder(parts.store)        # submit_instance / submit_step
    components += parts.components               # store, reporter if configured
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.store.api import TaskApi
from gateway.store.dialect import connector_for
from gateway.store.errors import StoreError
from gateway.store.records import InstanceRecord, StepRecord, StoredMetric
from gateway.store.reporter import ManagerReporter
from gateway.store.results_api import ResultsApi
from gateway.store.store import Store
from gateway.tasks.core.effects import InstanceState

if TYPE_CHECKING:
    from gateway.service import Component, Context

__all__ = [
    "InstanceRecord",
    "InstanceState",
    "ManagerReporter",
    "ResultsApi",
    "StepRecord",
    "Store",
    "StoreComponents",
    "StoreError",
    "StoredMetric",
    "TaskApi",
    "build_store_components",
]


@dataclass(frozen=True)
class StoreComponents:
    store: Store
    api: TaskApi
    reporter: ManagerReporter | None

    @property
    def components(self) -> list[Component]:
        """What runs: the store's writer and the reporter (the API is routes only)."""
        parts: list[Component] = [self.store]
        if self.reporter is not None:
            parts.append(self.reporter)
        return parts


def build_store_components(ctx: Context) -> StoreComponents:
    """The store on ``store.url`` (default: SQLite at ``settings.sqlite_path``) with its health
    check, its HTTP API on the admin listener, and the reporter if configured."""
    settings = ctx.settings
    store = Store(
        connect=connector_for(settings.store.url, settings.sqlite_path),
        metrics=ctx.metrics,
        alarm=ctx.ops.alarm,
    )
    ctx.http.add_health("store", store.health)
    reporter = None
    if settings.store.manager_url:
        reporter = ManagerReporter(
            store=store,
            url=settings.store.manager_url,
            secret=settings.store.manager_secret,
            retries=settings.store.manager_retries,
            metrics=ctx.metrics,
            alarm=ctx.ops.alarm,
        )
    api = TaskApi(store=store, admin=ctx.admin)
    return StoreComponents(store=store, api=api, reporter=reporter)
