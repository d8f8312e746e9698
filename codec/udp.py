"""Per-session UDP state: session key material, the uplink receiver and the downlink sender.

The UDP endpoint routes a datagram with :func:`codec.packet.peek_ssrc` (framing checks only, no
crypto), then hands it to the session's :class:`UplinkReceiver`. Replies go out through the
session's :class:`DownlinkSender`. Nothing here raises on bad input: every rejection is a
:class:`Dropped` with a :class:`~codec.packet.DropReason`, counted in ``drops``.

Sequence rules (reference §5.3). Downlink sequences start at 1 (devices drop 0 and duplicates).
Uplink packets whose header sequence is ``<= last`` are dropped as ``REPLAY`` before any crypto;
a gap ``seq - last - 1`` is reported as ``lost_before`` so the decoder can conceal those frames.

Forged-sequence mitigation. AES-CTR has no MAC: anyone who knows a session's ssrc can send a
datagram with any header, and it decrypts to garbage that we cannot tell from audio. If such a
packet could set ``last`` to, say, 2**32 - 1, every real packet after it would be a "replay" and
the session would be locked out. So ``last`` only advances when the packet is otherwise valid
(framing, ssrc) **and** its sequence is at most ``max_forward_jump`` (default 1000 frames =
60 s of 60 ms audio) ahead of ``last``; larger jumps are dropped as ``SEQ_JUMP`` without
touching state. A single forged packet can therefore skip the real stream forward by at most
that bound (a gap over 5 frames resets the decoder instead of being concealed, so the jump
costs one frame of decoding), never lock it out for good. Residual risk, inherent to the
protocol: an attacker on the path who keeps injecting can still disrupt a session; a real stream
that itself jumps more than the bound (a minute of continuous loss) is dropped until the next
hello, which devices send after their 120 s channel timeout.
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Final, Protocol

from codec.counter_space import (
    DOWNLINK_FLAGS,
    MAX_DOWNLINK_SEQ,
    UPLINK_FLAGS,
    UPLINK_SSRC_MASK,
    downlink_ssrc,
    downlink_timestamp,
)
from codec.packet import (
    HEADER_SIZE,
    KEY_SIZE,
    MAX_PAYLOAD,
    U32,
    CtrCipher,
    DropReason,
    Header,
    aes_key,
    check_header,
    open_payload,
    seal,
)

DEFAULT_MAX_FORWARD_JUMP: Final = 1000


class TokenSource(Protocol):
    """What key generation needs from a random source (``secrets`` satisfies it)."""

    def token_bytes(self, nbytes: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class SessionCrypto:
    """Fresh per-hello key material; ``key_hex``/``nonce_hex`` go into the hello reply."""

    key: bytes
    ssrc: int
    nonce: bytes

    @property
    def key_hex(self) -> str:
        return self.key.hex()

    @property
    def nonce_hex(self) -> str:
        return self.nonce.hex()


def nonce_for(ssrc: int) -> bytes:
    """``01 00 0000 <ssrc> 00000000 00000000``: the header template devices copy from."""
    return Header(ssrc=ssrc, timestamp=0, sequence=0, payload_len=0).pack()


def new_session_crypto(rng: TokenSource = secrets) -> SessionCrypto:
    """A random 16-byte key and a random nonzero 31-bit ssrc (the top bit marks the downlink,
    :mod:`codec.counter_space`), with the matching nonce."""
    key = rng.token_bytes(KEY_SIZE)
    ssrc = 0
    while ssrc == 0:
        ssrc = int.from_bytes(rng.token_bytes(4), "big") & UPLINK_SSRC_MASK
    return SessionCrypto(key=key, ssrc=ssrc, nonce=nonce_for(ssrc))


@dataclass(frozen=True, slots=True)
class Accepted:
    opus_payload: bytes
    seq: int
    timestamp: int
    lost_before: int


@dataclass(frozen=True, slots=True)
class Dropped:
    reason: DropReason


_DROPPED: Final = {reason: Dropped(reason) for reason in DropReason}


@dataclass(slots=True)
class UplinkReceiver:
    """Device → gateway: checks, replay protection, decryption, loss accounting."""

    key: bytes
    ssrc: int
    max_forward_jump: int = DEFAULT_MAX_FORWARD_JUMP
    flags: int = UPLINK_FLAGS  # the nonce's flags byte, which devices copy
    last_seq: int = 0
    accepted: int = 0
    lost: int = 0
    drops: Counter[DropReason] = field(default_factory=Counter)
    _aes: CtrCipher = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._aes = aes_key(self.key)

    @classmethod
    def for_session(
        cls, crypto: SessionCrypto, *, max_forward_jump: int = DEFAULT_MAX_FORWARD_JUMP
    ) -> UplinkReceiver:
        return cls(key=crypto.key, ssrc=crypto.ssrc, max_forward_jump=max_forward_jump)

    def accept(self, datagram: bytes, *, decrypt: bool = True) -> Accepted | Dropped:
        """:meth:`check` then :meth:`take`, for callers with nothing to do in between."""
        header = self.check(datagram)
        if isinstance(header, Dropped):
            return header
        return self.take(datagram, header, decrypt=decrypt)

    def check(self, datagram: bytes) -> Header | Dropped:
        """Framing, ssrc, flags and sequence (replay, forward jump): no AES and no state change
        but the drop count. The endpoint runs this before charging the session's rate budget,
        so a flood of replays costs the session nothing."""
        header = check_header(datagram)
        if isinstance(header, DropReason):
            return self._drop(header)
        reason = self.vet(header.ssrc, header.flags, header.sequence)
        return header if reason is None else _DROPPED[reason]

    def vet(self, ssrc: int, flags: int, seq: int) -> DropReason | None:
        """:meth:`check` on the fields of a datagram whose framing ``unpack_header`` passed
        (the endpoint's hot path builds no :class:`Header`): the refusal, counted, or None."""
        if ssrc != self.ssrc:
            reason = DropReason.UNKNOWN_SSRC
        elif flags != self.flags:  # devices copy the nonce's (0x00); 0x80 is downlink
            reason = DropReason.BAD_FLAGS
        elif seq <= self.last_seq:
            reason = DropReason.REPLAY
        elif seq - self.last_seq > self.max_forward_jump:
            reason = DropReason.SEQ_JUMP
        else:
            return None
        self.drops[reason] += 1
        return reason

    def decrypt(self, datagram: bytes) -> bytes:
        """The payload of a datagram :meth:`check` passed, with no state change (to vet it
        before accepting it)."""
        return open_payload(self._aes, datagram)

    def take(self, datagram: bytes, header: Header, *, decrypt: bool = True) -> Accepted:
        """Accept a datagram :meth:`check` let through: account its sequence and decrypt it.
        ``decrypt=False`` (nobody listens to this session's audio) skips only the AES and
        returns an empty payload."""
        payload, lost_before = self.advance(datagram, header.sequence, decrypt=decrypt)
        return Accepted(payload, header.sequence, header.timestamp, lost_before)

    def advance(self, datagram: bytes, seq: int, *, decrypt: bool = True) -> tuple[bytes, int]:
        """:meth:`take` for a sequence :meth:`vet` passed, without building an
        :class:`Accepted`: the payload (empty with ``decrypt=False``) and ``lost_before``."""
        lost_before = seq - self.last_seq - 1
        self.last_seq = seq
        self.accepted += 1
        self.lost += lost_before
        if decrypt:
            return self._aes.transform(datagram[:HEADER_SIZE], datagram[HEADER_SIZE:]), lost_before
        return b"", lost_before

    def _drop(self, reason: DropReason) -> Dropped:
        self.drops[reason] += 1
        return _DROPPED[reason]


@dataclass(slots=True)
class DownlinkSender:
    """Gateway → device, in the downlink counter space (:mod:`codec.counter_space`): flags
    0x80, the session ssrc with its top bit set, sequence from 1, timestamp 60 ms * sequence,
    exact ``payload_len``, ≤ 1500-byte datagrams. Devices check none of flags, ssrc or
    timestamp, so this never shares keystream with the device's uplink."""

    key: bytes
    ssrc: int  # the session's (uplink) ssrc
    last_seq: int = 0
    sent: int = 0
    drops: Counter[DropReason] = field(default_factory=Counter)
    _aes: CtrCipher = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._aes = aes_key(self.key)

    @classmethod
    def for_session(cls, crypto: SessionCrypto) -> DownlinkSender:
        return cls(key=crypto.key, ssrc=crypto.ssrc)

    def seal(self, opus_packet: bytes) -> bytes | DropReason:
        """The next datagram, or a counted ``DropReason`` (no sequence consumed):
        ``TOO_LARGE`` past 1484 bytes, ``SEQ_EXHAUSTED`` once the sequence space is used up
        (2**32 - 93 packets, about 8 years of audio; the session needs a new hello)."""
        if len(opus_packet) > MAX_PAYLOAD:
            return self._drop(DropReason.TOO_LARGE)
        if self.last_seq >= MAX_DOWNLINK_SEQ:
            return self._drop(DropReason.SEQ_EXHAUSTED)
        self.last_seq += 1
        self.sent += 1
        header = Header(
            ssrc=downlink_ssrc(self.ssrc),
            timestamp=downlink_timestamp(self.last_seq),
            sequence=self.last_seq,
            payload_len=len(opus_packet),
            flags=DOWNLINK_FLAGS,
        )
        return seal(self._aes, header, opus_packet)

    def _drop(self, reason: DropReason) -> DropReason:
        self.drops[reason] += 1
        return reason


@dataclass(slots=True)
class UplinkSender:
    """Device → gateway, the way firmware seals (header = the nonce with ``payload_len``,
    timestamp and sequence filled in). Tests, benchmarks and the demo play devices with it."""

    key: bytes
    ssrc: int
    flags: int = UPLINK_FLAGS
    last_seq: int = 0
    _aes: CtrCipher = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._aes = aes_key(self.key)

    @classmethod
    def for_session(cls, crypto: SessionCrypto) -> UplinkSender:
        return cls(key=crypto.key, ssrc=crypto.ssrc)

    def seal(self, opus_packet: bytes, timestamp: int = 0) -> bytes:
        """The next datagram (sequence from 1; no size limit: tests send oversized ones)."""
        self.last_seq = (self.last_seq + 1) & U32
        header = Header(
            ssrc=self.ssrc,
            timestamp=timestamp & U32,
            sequence=self.last_seq,
            payload_len=len(opus_packet) & 0xFFFF,
            flags=self.flags,
        )
        return seal(self._aes, header, opus_packet)


__all__ = [
    "HEADER_SIZE",
    "Accepted",
    "DownlinkSender",
    "Dropped",
    "SessionCrypto",
    "TokenSource",
    "UplinkReceiver",
    "UplinkSender",
    "new_session_crypto",
    "nonce_for",
]
