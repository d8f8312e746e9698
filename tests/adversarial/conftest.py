"""Adversarial tests run against the same real components as the integration tier: a real
Mosquitto with the project's config (``broker``, ``fresh_broker``), real UDP sockets, real
libopus. Each test performs the attack itself (see docs/security.md)."""

from __future__ import annotations

from tests.integration.conftest import broker, device_id, fresh_broker

__all__ = ["broker", "device_id", "fresh_broker"]
