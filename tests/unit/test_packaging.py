"""What the wheel ships: gateway, codec and topics — not the dev stack, and nothing that needs a
dev dependency (pyyaml is one: only `make asyncapi` and the tests use it; paho-mqtt and aiomqtt
are others: the gateway runs on its own MQTT client, gateway/mqtt/)."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("gateway", "codec", "topics")

# Imports every module of the shipped packages, then names what got imported that must not be.
_PROBE = """
import importlib, pkgutil, sys
for top in {shipped!r}:
    package = importlib.import_module(top)
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("yaml", "devstack", "tests", "bench"))
print(" ".join(bad))
"""


# The same walk with paho-mqtt and aiomqtt unimportable (as on an install without the dev
# extras); it first proves that the blocker blocks.
_WITHOUT_DEV_MQTT = """
import importlib, importlib.abc, pkgutil, sys

BLOCKED = ("paho", "aiomqtt")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Blocker())
for name in ("paho.mqtt.client", "aiomqtt"):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit(f"the blocker let {{name}} through")
for top in {shipped!r}:
    package = importlib.import_module(top)
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)))
"""


def test_the_wheel_ships_the_service_packages_and_not_the_dev_stack() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    for name in SHIPPED:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in include), name
    for name in ("devstack", "devstack.demo", "tests", "bench"):
        assert not any(fnmatch.fnmatch(name, pattern) for pattern in include), name
    runtime = " ".join(config["project"]["dependencies"]).lower()
    for dev_only in ("pyyaml", "paho-mqtt", "aiomqtt"):
        assert dev_only not in runtime


def test_no_shipped_module_imports_yaml_or_dev_code() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(shipped=SHIPPED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == ""


def test_every_shipped_module_imports_without_paho_or_aiomqtt() -> None:
    """Run-time independence from the dev extras: ``snlpgw`` serve, dev-run, doctor, provision,
    device, broker, OTA and both simulators import nothing of paho-mqtt or aiomqtt."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DEV_MQTT.format(shipped=SHIPPED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""


def test_every_dev_stack_and_benchmark_module_imports() -> None:
    """Nothing type-checks bench/: a module left on a moved import fails here, not at `make bench`."""
    probe = (
        "import importlib, pkgutil\n"
        "for top in ('devstack', 'bench'):\n"
        "    package = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(package.__path__, top + '.'):\n"
        "        if not info.name.endswith('__main__'):\n"
        "            importlib.import_module(info.name)\n"
    )
    subprocess.run([sys.executable, "-c", probe], cwd=ROOT, timeout=120, check=True)
