"""A bounded cache of spoken phrases: encoded Opus frames by key, LRU by bytes (pure).

Lessons say the same short phrases again and again ("Well done!", "三"): their synthesis and
encoding are done once. The key is (engine, voice, text) plus the output format (sample rate,
frame duration) the frames were encoded for. Size is the frames' bytes; an entry larger than
the whole budget is not kept. Hits and misses are counted here (the shell exports them).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PhraseKey:
    engine: str
    voice: str
    text: str
    sample_rate: int
    frame_ms: int


class PhraseCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[PhraseKey, tuple[bytes, ...]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is kept (not a use: counts nothing, moves nothing)."""
        return key in self._entries

    def get(self, key: PhraseKey) -> tuple[bytes, ...] | None:
        frames = self._entries.get(key)
        if frames is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return frames

    def put(self, key: PhraseKey, frames: tuple[bytes, ...]) -> bool:
        """Keep ``frames`` (evicting the least recently used); False if too large to keep."""
        size = sum(len(f) for f in frames)
        if size > self.max_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= sum(len(f) for f in old)
        while self._entries and self.bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= sum(len(f) for f in evicted)
            self.evictions += 1
        self._entries[key] = frames
        self.bytes += size
        return True
