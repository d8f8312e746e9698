"""`snlpgw doctor`'s ACL check on the split-listener broker config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.broker.rules import parse_passwd
from gateway.doctor.acl import check_acl
from gateway.doctor.network import Findings
from gateway.doctor.report import Status
from gateway.settings import Settings
from tests.support.broker import Broker, start_broker

pytestmark = pytest.mark.integration


@pytest.fixture
def split_broker(tmp_path: Path) -> Iterator[Broker]:
    running = start_broker(tmp_path / "data", split=True)
    yield running
    running.stop()


def test_doctor_acl_check_uses_the_device_listener(split_broker: Broker) -> None:
    """On a broker whose gateway listener admits no device user (`broker init`, `make run`),
    the doctor logs its throwaway device in on the device listener (where OTA sends boards):
    the ACL isolation check still runs and passes, and the device is revoked afterwards."""
    broker = split_broker
    settings = Settings(
        gateway_id="doc-listener", data_dir=broker.data_dir, mqtt={"url": broker.url}
    )
    before = set(parse_passwd(broker.files.password_file.read_text()))
    row = check_acl(settings, Findings(broker_up=True, gateway_login=True), broker.reload)
    assert (row.status, row.check) == (Status.OK, "ACL isolation"), row.detail
    assert set(parse_passwd(broker.files.password_file.read_text())) == before
