"""Composition root: which components a production gateway runs."""

from __future__ import annotations

from gateway.service import Component, Service
from gateway.settings import Settings


def build_service(settings: Settings) -> Service:
    components: list[Component] = []
    return Service(settings, components)
