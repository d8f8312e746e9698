"""The phrase cache: LRU by bytes, hits and misses counted (pure)."""

from __future__ import annotations

import pytest

from gateway.speech.cache import PhraseCache, PhraseKey


def key(text: str, voice: str = "en", engine: str = "espeak") -> PhraseKey:
    return PhraseKey(engine, voice, text, 16_000, 60)


def test_a_miss_then_a_hit() -> None:
    cache = PhraseCache(100)
    assert cache.get(key("a")) is None
    assert cache.put(key("a"), (b"x" * 10, b"y" * 5))
    assert cache.get(key("a")) == (b"x" * 10, b"y" * 5)
    assert (cache.hits, cache.misses, cache.bytes, len(cache)) == (1, 1, 15, 1)


def test_engine_voice_and_format_are_part_of_the_key() -> None:
    cache = PhraseCache(100)
    cache.put(key("a"), (b"1",))
    assert cache.get(key("a", voice="zh")) is None
    assert cache.get(key("a", engine="http")) is None
    assert cache.get(PhraseKey("espeak", "en", "a", 24_000, 60)) is None
    assert cache.misses == 3


def test_least_recently_used_is_evicted_by_bytes() -> None:
    cache = PhraseCache(30)
    cache.put(key("a"), (bytes(10),))
    cache.put(key("b"), (bytes(10),))
    cache.put(key("c"), (bytes(10),))
    assert cache.get(key("a")) is not None  # a is now the most recent
    cache.put(key("d"), (bytes(15),))  # needs 15: b (10) and c (10) go, in LRU order
    assert cache.get(key("b")) is None
    assert cache.get(key("c")) is None
    assert cache.get(key("a")) is not None
    assert (cache.bytes, cache.evictions, len(cache)) == (25, 2, 2)


def test_an_entry_larger_than_the_budget_is_not_kept() -> None:
    cache = PhraseCache(10)
    cache.put(key("a"), (bytes(5),))
    assert not cache.put(key("big"), (bytes(11),))
    assert cache.get(key("a")) is not None  # nothing evicted for it
    assert cache.bytes == 5


def test_replacing_a_key_accounts_its_old_size() -> None:
    cache = PhraseCache(20)
    cache.put(key("a"), (bytes(8),))
    cache.put(key("a"), (bytes(12),))
    assert (cache.bytes, len(cache), cache.evictions) == (12, 1, 0)


def test_a_zero_budget_keeps_nothing_and_a_negative_one_is_refused() -> None:
    cache = PhraseCache(0)
    assert not cache.put(key("a"), (b"1",))
    assert len(cache) == 0
    with pytest.raises(ValueError, match="max_bytes"):
        PhraseCache(-1)


def test_asking_whether_a_phrase_is_kept_is_not_a_use() -> None:
    cache = PhraseCache(3)
    cache.put(key("a"), (b"1",))
    cache.put(key("b"), (b"2",))
    assert key("a") in cache
    assert key("c") not in cache
    assert (cache.hits, cache.misses) == (0, 0)
    cache.put(key("c"), (b"3",))
    cache.put(key("d"), (b"4",))  # "a" is still the least recently used: it goes
    assert key("a") not in cache
