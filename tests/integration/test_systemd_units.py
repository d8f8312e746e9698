"""deploy/systemd: the units parse cleanly (`systemd-analyze verify`, no warnings), keep the
settings the deployment relies on, score as well hardened (`systemd-analyze security
--offline`), and the sysusers file creates the user. systemd is not PID 1 here: these tools read
unit files offline. `make setup` installs the `systemd` package, so this runs wherever
`make test` does; it skips only when the binaries are absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
UNITS = ROOT / "deploy" / "systemd"
INSTALL_DIR = "/opt/snlpgw"
SERVICES = ("snlpgw.service", "snlpgw-mosquitto.service")

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (`make setup` installs the systemd package)",
)


def _rendered(tmp_path: Path, edit: tuple[str, str] | None = None) -> list[Path]:
    """The units with the install dir pointed at this checkout (ExecStart must exist)."""
    assert (ROOT / ".venv" / "bin" / "snlpgw").exists()
    out = []
    for name in SERVICES:
        text = (UNITS / name).read_text().replace(INSTALL_DIR, str(ROOT))
        if edit is not None:
            text = text.replace(*edit)
        (tmp_path / name).write_text(text)
        out.append(tmp_path / name)
    return out


def _verify(units: list[Path]) -> str:
    done = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # verify exits 0 on unknown keys and unparsable values; any output is a finding.
    return f"rc={done.returncode}\n{done.stdout}{done.stderr}".strip()


def _settings(name: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for raw in (UNITS / name).read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_units_verify_without_findings(tmp_path: Path) -> None:
    assert _verify(_rendered(tmp_path)) == "rc=0"


def test_verify_reports_a_mistyped_setting(tmp_path: Path) -> None:
    report = _verify(_rendered(tmp_path, ("ProtectSystem=strict", "ProtectSystem=strikt")))
    assert "strikt" in report  # "Failed to parse protect system value, ignoring: strikt"


@pytest.mark.parametrize("name", SERVICES)
def test_units_keep_what_the_deployment_relies_on(name: str) -> None:
    s = _settings(name)
    assert s["Restart"] == ["on-failure"]
    assert s["User"] == ["snlpgw"]
    assert s["StateDirectory"] == ["snlpgw"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["NoNewPrivileges"] == ["yes"]
    assert s["CapabilityBoundingSet"] == [""]
    assert s["PrivateTmp"] == ["yes"]


def test_gateway_stops_before_the_broker() -> None:
    after = " ".join(_settings("snlpgw.service")["After"]).split()
    assert "snlpgw-mosquitto.service" in after  # stop order = reverse start order


@pytest.mark.parametrize("name", SERVICES)
def test_units_score_as_hardened(tmp_path: Path, name: str) -> None:
    unit = next(u for u in _rendered(tmp_path) if u.name == name)
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= 2.0  # systemd rates below 2.0 "OK" (10 = unprotected)


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="no systemd-sysusers")
def test_sysusers_creates_the_service_user(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            "systemd-sysusers",
            f"--root={tmp_path}",
            "--dry-run",
            str(UNITS / "snlpgw.sysusers.conf"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Creating user 'snlpgw'" in done.stdout + done.stderr
