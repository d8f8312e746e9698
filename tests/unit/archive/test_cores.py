"""The archive's pure cores: signed links and what retention and the quota erase."""

from __future__ import annotations

import pytest

from gateway.archive.links import LinkCheck, check_audio_link, sign_audio_link
from gateway.archive.retention import DAY_MS, over_quota, retention_cutoff_ms
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
