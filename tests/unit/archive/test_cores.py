"""The archive's pure cores: signed links and what retention and the quota erase."""

from __future__ import annotations

import pytest

from gateway.archive.links import LinkCheck, check_audio_link, sign_audio_link
from gateway.archive.retention import DAY_MS, QuotaLedger, over_quota, retention_cutoff_ms
from gateway.store.records import ArchivedAudio

KEY = b"k" * 32
AID = "ab" * 32


def test_a_link_is_valid_until_it_expires() -> None:
    link = sign_audio_link(KEY, AID, now_ms=1_000, ttl_s=60)
    assert link.expires_ms == 61_000
    assert link.url == f"/admin/audio/{AID}?expires=61000&sig={link.signature}"
    exp = str(link.expires_ms)
    assert check_audio_link(KEY, AID, exp, link.signature, now_ms=60_999) is LinkCheck.OK
    assert check_audio_link(KEY, AID, exp, link.signature, now_ms=61_000) is LinkCheck.EXPIRED


def test_a_forged_or_altered_link_is_refused() -> None:
    link = sign_audio_link(KEY, AID, now_ms=0, ttl_s=60)
    exp = str(link.expires_ms)
    assert check_audio_link(b"other", AID, exp, link.signature, now_ms=0) is LinkCheck.BAD
    assert check_audio_link(KEY, "cd" * 32, exp, link.signature, now_ms=0) is LinkCheck.BAD
    assert check_audio_link(KEY, AID, "999999", link.signature, now_ms=0) is LinkCheck.BAD
    assert check_audio_link(KEY, "../etc", exp, link.signature, now_ms=0) is LinkCheck.BAD
    assert check_audio_link(KEY, AID, "-1", link.signature, now_ms=0) is LinkCheck.BAD
    assert check_audio_link(KEY, AID, "9" * 16, link.signature, now_ms=0) is LinkCheck.BAD
    with pytest.raises(ValueError, match="audio id"):
        sign_audio_link(KEY, "nope", now_ms=0, ttl_s=1)


def _row(aid: str, created_ms: int, size: int) -> ArchivedAudio:
    return ArchivedAudio(aid, "dev", "i", 0, created_ms, size, 1000)


def test_retention_cutoff() -> None:
    assert retention_cutoff_ms(40 * DAY_MS, 30) == 10 * DAY_MS
    assert retention_cutoff_ms(DAY_MS, 0.5) == DAY_MS // 2


def test_the_quota_erases_the_oldest_first() -> None:
    rows = [_row("a", 1, 100), _row("b", 2, 100), _row("c", 3, 100)]
    assert over_quota(rows, 300) == []
    assert over_quota(rows, 250) == ["a"]
    assert over_quota(rows, 100) == ["a", "b"]
    assert over_quota(rows, 0) == ["a", "b", "c"]
    assert over_quota([], 0) == []


def test_the_quota_ledger_trusts_a_fresh_total_and_counts_what_was_written() -> None:
    ledger = QuotaLedger(refresh_ms=1000, max_devices=2)
    assert ledger.total("a", 0) is None  # never read: read the store
    ledger.wrote("a", 10)  # unknown device: nothing kept (the next read includes it)
    assert ledger.total("a", 0) is None
    ledger.read("a", 100, 0)
    ledger.wrote("a", 10)
    assert ledger.total("a", 1000) == 110
    assert ledger.total("a", 1001) is None  # stale: another gateway may have written
    ledger.read("b", 5, 0)
    ledger.read("a", 100, 0)  # a is now the most recently used
    ledger.read("c", 7, 0)  # past max_devices: b (least recently used) goes
    assert (ledger.total("a", 0), ledger.total("b", 0), ledger.total("c", 0)) == (100, None, 7)
    assert ledger.total("a", 0) == 100  # a used, c is now the oldest
    ledger.read("d", 1, 0)
    assert (ledger.total("a", 0), ledger.total("c", 0), ledger.total("d", 0)) == (100, None, 1)
    ledger.forget("a")
    assert ledger.total("a", 0) is None
    ledger.forget("nobody")
    ledger.forget()
    assert ledger.total("d", 0) is None
