"""What the OTA trust model keeps on disk: bindings, the device key, operator files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.xiaozhi.ota.trust import Binding
from gateway.xiaozhi.ota.trust_store import (
    HmacKey,
    TrustFileError,
    bindings_path,
    device_key,
    device_password,
    load_allowlist,
    load_bindings,
    load_hmac_keys,
    save_bindings,
)

DEV = "24_0a_c4_12_34_56"


def test_bindings_round_trip_and_a_missing_file_is_empty(tmp_path: Path) -> None:
    path = bindings_path(tmp_path)
    assert load_bindings(path) == {}
    bindings = {DEV: Binding("uuid-1", 3, "SN1"), "24_0a_c4_00_00_01": Binding("uuid-2")}
    save_bindings(path, bindings)
    assert load_bindings(path) == bindings
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("text", ["{not json", '{"devices": {"x": {"client_id": 1}}}', "[]"])
def test_an_unreadable_bindings_file_is_an_error_never_empty(tmp_path: Path, text: str) -> None:
    path = bindings_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(TrustFileError, match="unreadable"):
        load_bindings(path)


def test_device_key_is_created_once_private_and_stable(tmp_path: Path) -> None:
    key = device_key(tmp_path)
    assert len(key) == 32
    assert device_key(tmp_path) == key
    assert (tmp_path / "secrets" / "ota.key").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(("text", "message"), [("zz\n", "not a hex key"), ("abcd\n", "too short")])
def test_a_bad_device_key_is_refused(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "ota.key").write_text(text)
    with pytest.raises(TrustFileError, match=message):
        device_key(tmp_path)


def test_passwords_are_derived_per_device_client_and_generation() -> None:
    key, client = bytes(32), "6f1c2d3e-0000-4000-8000-000000000001"
    one = device_password(key, DEV, client, 1)
    assert one == device_password(key, DEV, client, 1)
    assert len(one) == 32
    others = {
        device_password(key, DEV, client, 2),
        device_password(key, "24_0a_c4_00_00_01", client, 1),
        device_password(key, DEV, "6f1c2d3e-0000-4000-8000-000000000002", 1),
        device_password(b"\x01" * 32, DEV, client, 1),
    }
    assert one not in others
    assert len(others) == 4


def test_allowlist_from_setting_and_file(tmp_path: Path) -> None:
    path = tmp_path / "allow.txt"
    path.write_text("# sold boards\n24:0A:C4:12:34:56  # kitchen\n\n24_0a_c4_00_00_02\n")
    assert load_allowlist(["24-0a-c4-00-00-01"], path) == {
        DEV,
        "24_0a_c4_00_00_01",
        "24_0a_c4_00_00_02",
    }
    assert load_allowlist([], None) == frozenset()


def test_bad_allowlists_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TrustFileError, match="allowlist entry 'nope'"):
        load_allowlist(["nope"], None)
    with pytest.raises(TrustFileError, match="No such file"):
        load_allowlist([], tmp_path / "missing.txt")


def test_hmac_keys_plain_or_pinned_to_a_mac(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(
        json.dumps({"SN1": "00" * 32, "SN2": {"key": "11" * 16, "mac": "24:0a:c4:12:34:56"}})
    )
    assert load_hmac_keys(path) == {
        "SN1": HmacKey(bytes(32), None),
        "SN2": HmacKey(b"\x11" * 16, DEV),
    }
    assert load_hmac_keys(None) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[]", "expected"),
        ('{"SN": "abcd"}', "needs a >= 16-byte"),
        ('{"SN": "zz"}', "needs a >= 16-byte"),
        ('{"SN": 5}', "needs a >= 16-byte"),
        ('{"SN": {"key": "' + "00" * 16 + '", "mac": "nope"}}', "needs a >= 16-byte"),
    ],
)
def test_bad_hmac_key_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "keys.json"
    path.write_text(text)
    with pytest.raises(TrustFileError, match=message):
        load_hmac_keys(path)
    with pytest.raises(TrustFileError, match="No such file"):
        load_hmac_keys(tmp_path / "missing.json")
