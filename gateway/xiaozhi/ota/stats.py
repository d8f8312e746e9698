"""The OTA endpoint's own figures (next to ``xiaozhi_ota_requests_total{status}``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import Counter

from gateway.metrics import Metrics


@dataclass
class OtaStats:
    metrics: Metrics
    refused: Counter = field(init=False)
    activations: Counter = field(init=False)
    approvals: Counter = field(init=False)

    def __post_init__(self) -> None:
        m = self.metrics
        self.refused = m.counter(
            "xiaozhi_ota_refused",
            "OTA requests refused: rate_ip, rate_mac, user_cap, devices_full, pending_full, "
            "not_allowlisted, busy",
            ["reason"],
        )
        self.activations = m.counter(
            "xiaozhi_ota_activations",
            "Activation codes issued and /activate outcomes (activate_done, activate_pending, "
            "activate_unknown, activate_bad_hmac)",
            ["outcome"],
        )
        self.approvals = m.counter(
            "xiaozhi_ota_approvals", "Admin approvals: approved, unknown, locked", ["outcome"]
        )
