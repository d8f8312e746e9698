"""Short-lived signed links to archived audio (pure: the time is an input).

A link names one blob and an expiry (epoch ms) and carries ``HMAC-SHA256(key, "id.expiry")``:
whoever holds it may fetch that one answer until it expires, and nothing else. The admin route
that serves it takes no bearer token (the signature is the credential: ``RouteDoc(bearer=False)``
in gateway/http.py) but listens only where the admin listener does (loopback by default), so a
link that leaks is useless off the operator network and dead after ``link_ttl_s``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
from dataclasses import dataclass

AUDIO_ID = re.compile(r"^[0-9a-f]{64}$")  # sha256 hex of the Ogg file (content address)
AUDIO_PATH = "/admin/audio/{audio_id}"


class LinkCheck(enum.Enum):
    OK = "ok"
    BAD = "bad_signature"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class SignedAudioLink:
    audio_id: str
    expires_ms: int
    signature: str

    @property
    def url(self) -> str:
        """Path and query on the admin listener."""
        path = AUDIO_PATH.format(audio_id=self.audio_id)
        return f"{path}?expires={self.expires_ms}&sig={self.signature}"


def _mac(key: bytes, audio_id: str, expires_ms: int) -> str:
    return hmac.new(key, f"{audio_id}.{expires_ms}".encode(), hashlib.sha256).hexdigest()


def sign_audio_link(key: bytes, audio_id: str, *, now_ms: int, ttl_s: int) -> SignedAudioLink:
    """A link to ``audio_id`` valid for ``ttl_s`` from ``now_ms`` (ValueError: not an id)."""
    if not AUDIO_ID.match(audio_id):
        raise ValueError("not an audio id")
    expires_ms = now_ms + ttl_s * 1000
    return SignedAudioLink(audio_id, expires_ms, _mac(key, audio_id, expires_ms))


def check_audio_link(
    key: bytes, audio_id: str, expires: str, signature: str, *, now_ms: int
) -> LinkCheck:
    """Is this link genuine (constant-time comparison) and still valid at ``now_ms``?"""
    if not AUDIO_ID.match(audio_id) or not expires.isdigit() or len(expires) > 15:
        return LinkCheck.BAD
    expires_ms = int(expires)
    if not hmac.compare_digest(_mac(key, audio_id, expires_ms), signature):
        return LinkCheck.BAD
    return LinkCheck.OK if now_ms < expires_ms else LinkCheck.EXPIRED
