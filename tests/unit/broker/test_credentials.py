"""Broker credential files: names, ACL rendering, `$7$` hashes, registry, locking, CLI."""

from __future__ import annotations

import json
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.broker import registry
from gateway.broker.credentials import (
    BrokerFiles,
    device_listener_port,
    gateway_mqtt_password,
    gateway_password,
    gateway_secret,
    init_broker_files,
    local_broker_url,
    pid_file_reloader,
    provision,
    revoke,
)
from gateway.broker.rules import (
    GATEWAY_USERNAME,
    ConfigPaths,
    CredentialsError,
    Role,
    check_name,
    default_device_port,
    hash_password,
    parse_passwd,
    render_acl,
    render_config,
    verify_password,
)
from gateway.cli.main import main
from gateway.settings import load_settings

REPO = Path(__file__).resolve().parents[3]
DEV = "aa_bb_cc_dd_ee_ff"


class CountingReloader:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def _hashes(data_dir: Path) -> dict[str, str]:
    return parse_passwd(BrokerFiles.at(data_dir).password_file.read_text())


@pytest.mark.parametrize(
    ("name", "role", "ok"),
    [
        (DEV, Role.DEVICE, True),
        ("AA_BB_CC_DD_EE_FF", Role.DEVICE, False),
        ("aa:bb:cc:dd:ee:ff", Role.DEVICE, False),
        ("aa_bb_cc_dd_ee", Role.DEVICE, False),
        ("ops-1", Role.DEVICE, False),
        ("ops-1", Role.OPS, True),
        ("backend_app", Role.BACKEND, True),
        (DEV, Role.OPS, False),  # a role user named like a device would get device patterns
        (DEV, Role.BACKEND, False),
        ("ops\nuser snlp-gateway", Role.OPS, False),  # ACL line injection
        ("ops x", Role.OPS, False),
        ("ops/#", Role.OPS, False),
        ("+", Role.BACKEND, False),
        ("", Role.OPS, False),
        ("1ops", Role.OPS, False),
    ],
)
def test_name_rules(name: str, role: Role, ok: bool) -> None:
    if ok:
        check_name(name, role)
    else:
        with pytest.raises(CredentialsError):
            check_name(name, role)


def test_acl_denies_device_trees_for_role_users_before_patterns() -> None:
    acl = render_acl({"opsx": Role.OPS, "be": Role.BACKEND, GATEWAY_USERNAME: Role.GATEWAY})
    blocks = {b.split("\n")[1]: b for b in acl.split("\n\n") if b.startswith("# role:")}
    for user in ("user opsx", "user be"):
        lines = blocks[user].splitlines()
        denies = [i for i, line in enumerate(lines) if line.startswith("topic deny")]
        assert {lines[i] for i in denies} == {
            "topic deny snlp/v1/#",
            "topic deny device-server/#",
            "topic deny devices/#",
        }
    assert "topic deny" not in blocks[f"user {GATEWAY_USERNAME}"]
    assert "topic write" not in blocks["user opsx"]
    assert "topic write snlpgw/v1/ctl/+" in blocks["user be"]
    assert "pattern write snlp/v1/%u/evt" in acl
    assert "pattern read snlp/v1/%u/cmd" in acl
    assert "pattern read devices/p2p/%u" in acl
    assert acl.index("\npattern ") > acl.index("\nuser opsx")


def test_acl_has_no_block_for_devices() -> None:
    acl = render_acl({DEV: Role.DEVICE})
    assert DEV not in acl


def test_our_hash_verifies_and_rejects_wrong_password() -> None:
    encoded = hash_password("s3cret")
    assert encoded.startswith("$7$101$")
    assert verify_password("s3cret", encoded)
    assert not verify_password("s3cret ", encoded)
    assert not verify_password("s3cret", "$6$bogus")


def test_mosquitto_passwd_hash_verifies_with_our_code(tmp_path: Path) -> None:
    """The `$7$` format we write is the one mosquitto_passwd 2.0 writes."""
    passwd = tmp_path / "passwd"
    passwd.touch()
    subprocess.run(["mosquitto_passwd", "-b", str(passwd), "u1", "pw-1"], check=True)
    encoded = parse_passwd(passwd.read_text())["u1"]
    assert verify_password("pw-1", encoded)
    assert not verify_password("pw-2", encoded)
    # Same salt → byte-identical hash to the tool's.
    import base64  # noqa: PLC0415

    salt = base64.b64decode(encoded.split("$")[3])
    assert hash_password("pw-1", salt=salt) == encoded


def test_the_gateway_connects_with_the_configured_password_else_the_one_in_its_data_dir(
    tmp_path: Path,
) -> None:
    assert gateway_mqtt_password(load_settings(data_dir=str(tmp_path))) is None
    init_broker_files(tmp_path, listener_port=18999)
    written = gateway_password(tmp_path)
    assert gateway_mqtt_password(load_settings(data_dir=str(tmp_path))) == written
    configured = load_settings(data_dir=str(tmp_path), mqtt={"password": "set-in-settings"})
    assert gateway_mqtt_password(configured) == "set-in-settings"


def test_password_precedence_setting_then_file_then_data_dir(tmp_path: Path) -> None:
    """mqtt.password > mqtt.password_file > <data_dir>/secrets/gateway.password."""
    init_broker_files(tmp_path / "gw", listener_port=18999)
    in_data_dir = gateway_password(tmp_path / "gw")
    shared = tmp_path / "shared.password"
    shared.write_text("from-the-broker\n")
    both = {"mqtt": {"password": "in-settings", "password_file": str(shared)}}
    secret = gateway_secret(load_settings(data_dir=str(tmp_path / "gw"), **both))
    assert (secret.password, secret.source) == ("in-settings", "mqtt.password")
    file_only = {"mqtt": {"password_file": str(shared)}}
    secret = gateway_secret(load_settings(data_dir=str(tmp_path / "gw"), **file_only))
    assert (secret.password, secret.source) == ("from-the-broker", f"mqtt.password_file {shared}")
    secret = gateway_secret(load_settings(data_dir=str(tmp_path / "gw")))
    assert secret.password == in_data_dir
    assert secret.source == str(tmp_path / "gw" / "secrets" / "gateway.password")
    assert "from-the-broker" not in repr(secret)
    assert in_data_dir not in repr(secret)


def test_a_configured_password_file_is_the_only_place_looked_at(tmp_path: Path) -> None:
    init_broker_files(tmp_path, listener_port=18999)  # a data-dir password that must not be used
    absent = tmp_path / "absent.password"
    settings = load_settings(data_dir=str(tmp_path), mqtt={"password_file": str(absent)})
    secret = gateway_secret(settings)
    assert secret.password is None
    assert secret.problem == f"mqtt.password_file {absent} missing"
    empty = tmp_path / "empty.password"
    empty.write_text(" \n")
    settings = load_settings(data_dir=str(tmp_path), mqtt={"password_file": str(empty)})
    assert gateway_secret(settings).problem == f"mqtt.password_file {empty} is empty"
    unreadable = load_settings(data_dir=str(tmp_path), mqtt={"password_file": str(tmp_path)})
    problem = gateway_secret(unreadable).problem or ""
    assert problem.startswith(f"mqtt.password_file {tmp_path} unreadable (")


def test_no_password_anywhere_names_the_setting_to_fix(tmp_path: Path) -> None:
    secret = gateway_secret(load_settings(data_dir=str(tmp_path)))
    assert secret.password is None
    problem = secret.problem or ""
    assert f"{tmp_path}/secrets/gateway.password missing" in problem
    assert "mqtt.password and mqtt.password_file unset" in problem
    assert "SNLPGW_MQTT__PASSWORD_FILE" in problem


def test_init_is_idempotent_and_private(tmp_path: Path) -> None:
    files = init_broker_files(tmp_path, listener_port=18999)
    password = gateway_password(tmp_path)
    first_hash = _hashes(tmp_path)[GATEWAY_USERNAME]
    assert verify_password(password, first_hash)
    init_broker_files(tmp_path, listener_port=19000)
    assert gateway_password(tmp_path) == password
    assert _hashes(tmp_path)[GATEWAY_USERNAME] == first_hash
    assert local_broker_url(tmp_path) == "mqtt://127.0.0.1:19000"
    for private in (files.password_file, files.acl_file, files.gateway_password_file):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert "allow_anonymous false" in files.config.read_text()


def test_provision_device_rotation_and_registry_without_secrets(tmp_path: Path) -> None:
    init_broker_files(tmp_path)
    reloads = CountingReloader()
    creds = provision(tmp_path, DEV, reload=reloads)
    assert creds.password is not None
    assert verify_password(creds.password, _hashes(tmp_path)[DEV])
    assert creds.client_id is not None
    assert creds.client_id.startswith(f"GID_snlp@@@{DEV}@@@")
    assert f"snlp/v1/{DEV}/evt" in creds.publish
    assert creds.subscribe == (f"snlp/v1/{DEV}/cmd", f"devices/p2p/{DEV}")
    assert creds.password not in repr(creds)

    rotated = provision(tmp_path, DEV, reload=reloads)
    assert rotated.password not in (None, creds.password)
    assert not verify_password(creds.password, _hashes(tmp_path)[DEV])

    kept = provision(tmp_path, DEV, rotate=False, reload=reloads)
    assert kept.password is None
    assert rotated.password is not None
    assert verify_password(rotated.password, _hashes(tmp_path)[DEV])
    assert reloads.calls == 3

    registry = BrokerFiles.at(tmp_path).registry.read_text()
    assert rotated.password not in registry
    assert json.loads(registry)["users"][DEV]["role"] == "device"


def test_role_conflicts_and_gateway_password_kept(tmp_path: Path) -> None:
    provision(tmp_path, "opsx", role="ops", reload=None)
    with pytest.raises(CredentialsError, match="already registered as ops"):
        provision(tmp_path, "opsx", role="backend", reload=None)
    stored = gateway_password(tmp_path)
    again = provision(tmp_path, GATEWAY_USERNAME, role="gateway", rotate=False, reload=None)
    assert again.password == stored
    with pytest.raises(CredentialsError):
        revoke(tmp_path, GATEWAY_USERNAME, reload=None)
    assert revoke(tmp_path, "opsx", reload=None)
    assert not revoke(tmp_path, "opsx", reload=None)
    assert "opsx" not in _hashes(tmp_path)
    assert "user opsx" not in BrokerFiles.at(tmp_path).acl_file.read_text()


def test_concurrent_provisioning_loses_nobody(tmp_path: Path) -> None:
    init_broker_files(tmp_path)
    ids = [f"00_00_00_00_00_{i:02x}" for i in range(24)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda d: provision(tmp_path, d, reload=None), ids))
    hashes = _hashes(tmp_path)
    for creds in results:
        assert creds.password is not None
        assert verify_password(creds.password, hashes[creds.username])
    users = json.loads(BrokerFiles.at(tmp_path).registry.read_text())["users"]
    assert set(ids) <= set(users)


def test_a_reload_between_the_writes_never_admits_a_user_without_its_acl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mosquitto's reload reads the password files, then the ACL (and a SIGHUP that arrives
    during a reload is lost). Race: a reload that runs while ``provision`` writes its files.
    Any state of the password files, paired with the same or any later state of the ACL, must
    give every role user it admits that user's ACL block."""
    files = BrokerFiles.at(tmp_path)
    init_broker_files(tmp_path)
    states: list[tuple[set[str], str]] = []  # (users the password files admit, the ACL)
    real_write = registry.write_atomic

    def write_and_look(path: Path, text: str, *, mode: int) -> None:
        real_write(path, text, mode=mode)
        admitted = set(_hashes(tmp_path))
        for split in (files.gateway_listener_passwd, files.device_listener_passwd):
            if split.exists():
                admitted |= set(parse_passwd(split.read_text()))
        acl = files.acl_file.read_text() if files.acl_file.exists() else ""
        states.append((admitted, acl))

    monkeypatch.setattr(registry, "write_atomic", write_and_look)
    provision(tmp_path, "backend-one", role="backend", reload=None)
    provision(tmp_path, "ops-one", role="ops", reload=None)
    assert states
    for k, (admitted, _) in enumerate(states):
        for _, acl in states[k:]:
            for user in admitted - {GATEWAY_USERNAME}:
                assert f"user {user}\n" in acl, (user, k)


def test_pid_file_reloader_never_signals_a_stranger(tmp_path: Path) -> None:
    pid_file = tmp_path / "mosquitto.pid"
    pid_file_reloader(pid_file)()  # no pid file: nothing to do, no error
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        pid_file.write_text(f"{stranger.pid}\n")
        pid_file_reloader(pid_file)()
        assert stranger.poll() is None  # SIGHUP would have terminated `sleep`
    finally:
        stranger.kill()
        stranger.wait()


def test_committed_example_config_matches_renderer() -> None:
    """mosquitto.dev.conf is what `make run` and `snlpgw broker init` write: the gateway's
    listener on 1883 and the devices' on 1893, split password files."""
    rendered = render_config(
        _split_paths(),
        listener_host="127.0.0.1",
        listener_port=1883,
        run_as=None,
        device_listener=("127.0.0.1", default_device_port(1883)),
    )
    assert (REPO / "mosquitto" / "mosquitto.dev.conf").read_text() == rendered


@pytest.mark.parametrize(("gateway", "device"), [(1883, 1893), (1884, 1894), (65530, 65520)])
def test_the_device_listener_sits_beside_the_gateways(gateway: int, device: int) -> None:
    assert default_device_port(gateway) == device


def test_cli_provision_prints_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["broker", "init", "--data-dir", str(tmp_path), "--port", "18777"]) == 0
    assert "devices 127.0.0.1:18787" in capsys.readouterr().out
    assert device_listener_port(tmp_path) == 18787  # the production shape by default
    assert main(["provision", DEV, "--data-dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["username"] == DEV
    assert out["broker_url"] == "mqtt://127.0.0.1:18787"  # devices log in on their listener
    assert main(["provision", "--role", "ops", "grafana", "--data-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["broker_url"] == "mqtt://127.0.0.1:18777"
    assert verify_password(out["password"], _hashes(tmp_path)[DEV])
    assert main(["provision", "--role", "ops", DEV, "--data-dir", str(tmp_path)]) == 2
    assert "invalid" not in capsys.readouterr().out
    assert _hashes(tmp_path).keys() == {GATEWAY_USERNAME, DEV, "grafana"}


def test_committed_example_acl_matches_renderer() -> None:
    users = {
        GATEWAY_USERNAME: Role.GATEWAY,
        "ops-dashboard": Role.OPS,
        "parent-app": Role.BACKEND,
        DEV: Role.DEVICE,
    }
    assert (REPO / "mosquitto" / "acl.example").read_text() == render_acl(users)


def test_corrupt_registry_is_a_typed_error_and_changes_nothing(tmp_path: Path) -> None:
    init_broker_files(tmp_path)
    files = BrokerFiles.at(tmp_path)
    before = files.password_file.read_text()
    files.registry.write_text('{"version": 1, "users": {"x": {"role": "wizard"}}}')
    with pytest.raises(CredentialsError, match="unreadable user registry"):
        provision(tmp_path, DEV, reload=None)
    assert files.password_file.read_text() == before


def _split_paths(*, split_files: bool = True) -> ConfigPaths:
    base = Path(".data/mosquitto")
    return ConfigPaths(
        base / "passwd",
        base / "acl",
        base / "mosquitto.pid",
        base / "data",
        gateway_password_file=base / "passwd.gateway" if split_files else None,
        device_password_file=base / "passwd.devices" if split_files else None,
    )


@pytest.mark.parametrize("shared", [False, True])
def test_device_listener_forces_client_id_to_user_name(shared: bool) -> None:
    rendered = render_config(
        _split_paths(),
        listener_host="127.0.0.1",
        listener_port=1883,
        run_as=None,
        device_listener=("0.0.0.0", 1884),
        devices_on_gateway_listener=shared,
    )
    head, gateway_part = rendered.split("listener 1883 127.0.0.1\n")
    gateway_part, device_part = gateway_part.split("listener 1884 0.0.0.0\n")
    assert "per_listener_settings true\n" in head
    assert "\nset_tcp_nodelay true\n" in rendered  # Nagle off: see mosquitto/README.md
    assert "password_file" not in head
    assert "use_username_as_clientid" not in gateway_part
    gateway_file = "passwd" if shared else "passwd.gateway"
    assert f"password_file .data/mosquitto/{gateway_file}\n" in gateway_part
    assert device_part.startswith("protocol mqtt\nuse_username_as_clientid true\n")
    assert "password_file .data/mosquitto/passwd.devices\n" in device_part
    for part in (gateway_part, device_part):
        assert "allow_anonymous false\n" in part
        assert "acl_file .data/mosquitto/acl\n" in part


def test_device_listener_needs_split_password_files() -> None:
    with pytest.raises(ValueError, match="device listener"):
        render_config(
            _split_paths(split_files=False),
            listener_host="127.0.0.1",
            listener_port=1883,
            run_as=None,
            device_listener=("0.0.0.0", 1884),
        )


def test_listener_password_files_split_users_by_role(tmp_path: Path) -> None:
    files = init_broker_files(tmp_path, listener_port=19000, device_port=19001)
    provision(tmp_path, DEV, reload=None)
    provision(tmp_path, "grafana", role="ops", reload=None)
    assert device_listener_port(tmp_path) == 19001
    assert local_broker_url(tmp_path) == "mqtt://127.0.0.1:19000"
    gateway_side = parse_passwd(files.gateway_listener_passwd.read_text())
    device_side = parse_passwd(files.device_listener_passwd.read_text())
    assert gateway_side.keys() == {GATEWAY_USERNAME, "grafana"}
    assert device_side.keys() == {DEV}
    assert _hashes(tmp_path) == gateway_side | device_side
    assert revoke(tmp_path, DEV, reload=None)
    assert parse_passwd(files.device_listener_passwd.read_text()) == {}
    for private in (files.gateway_listener_passwd, files.device_listener_passwd):
        assert private.stat().st_mode & 0o777 == 0o600
    init_broker_files(tmp_path, listener_port=19000)
    assert device_listener_port(tmp_path) is None
    assert device_listener_port(tmp_path / "nowhere") is None
