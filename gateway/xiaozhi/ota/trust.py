"""Who may receive a device's broker credentials over OTA: the trust book, pure (time is input).

Rules (README "Xiaozhi OTA"):

* **First contact binds.** The first well-formed request for a MAC binds it to the request's
  ``Client-Id`` (the UUID the firmware keeps in NVS) and is answered with credentials. New
  bindings create broker users, so they draw on an hourly budget (``users_per_hour``) and the
  table is capped (``max_devices``).
* **The bound Client-Id** gets the same credentials every time: password generation ``g`` of
  the binding (the shell derives the password from it and the binding's Client-Id, so a MAC
  forgotten and bound again by another Client-Id never gets a password handed out before;
  nothing is rotated per request).
* **Any other Client-Id** gets an ``activation`` (a 6-digit code and a challenge) and nothing
  else. An operator or parent approves the code (:meth:`TrustBook.approve`), or a board with an
  operator-provisioned HMAC key answers the challenge (:meth:`TrustBook.activate`); either
  binds the new Client-Id with generation ``g + 1``, so whoever held the old one is locked out.
  A valid HMAC binds only a MAC that is unbound or was bound by the same serial: a key proves
  which serial a board has, not which MAC it may claim. Binding an unbound MAC this way draws
  on the same caps as a first contact (else one key could mint users without end).
* A request naming a serial whose key the operator provisioned must prove it even on first
  contact (no binding without the HMAC or an approval).
* Policy ``open`` serves credentials to every Client-Id (lab use); ``allowlist`` refuses MACs
  the operator did not list before anything else happens.

Pending activations are bounded (``max_pending`` in all, ``max_pending_per_device`` per MAC),
expire after ``code_ttl_s``, and wrong codes drain a failure bucket: when it is empty every
approval is refused (``locked``) until it refills, so codes cannot be enumerated.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum, StrEnum

from gateway.xiaozhi.ratelimit import TokenBucket


class Policy(StrEnum):
    OPEN = "open"
    BIND = "bind"
    ALLOWLIST = "allowlist"


class OtaRefusal(StrEnum):
    """Why a device gets neither credentials nor an activation (metric label)."""

    NOT_ALLOWLISTED = "not_allowlisted"
    USER_CAP = "user_cap"
    DEVICES_FULL = "devices_full"
    PENDING_FULL = "pending_full"


class Verdict(Enum):
    CREDENTIALS = "credentials"
    ACTIVATE = "activate"
    REFUSE = "refuse"


class Approval(StrEnum):
    APPROVED = "approved"
    UNKNOWN = "unknown"  # no such code (or it expired)
    LOCKED = "locked"  # too many wrong codes lately


class Activation(StrEnum):
    """Outcome of ``POST /xiaozhi/ota/activate`` (HTTP 200, 202, 404, 403)."""

    DONE = "done"
    PENDING = "pending"
    UNKNOWN = "unknown"
    BAD_HMAC = "bad_hmac"


@dataclass(frozen=True, slots=True)
class Binding:
    client_id: str
    generation: int = 1
    serial: str | None = None  # set when the board proved its serial's HMAC key


@dataclass(frozen=True, slots=True)
class Pending:
    code: str
    dev: str
    client_id: str
    challenge: str
    serial: str | None
    expires: float


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    generation: int = 0  # CREDENTIALS: the binding's password generation
    client_id: str = ""  # CREDENTIALS: the binding's Client-Id (the password is derived from it)
    new_binding: bool = False  # first contact: a new broker user
    pending: Pending | None = None  # ACTIVATE
    refusal: OtaRefusal | None = None  # REFUSE


@dataclass(frozen=True, slots=True)
class TrustConfig:
    policy: Policy = Policy.BIND
    allowlist: frozenset[str] = frozenset()
    code_ttl_s: float = 600.0
    max_pending: int = 256
    max_pending_per_device: int = 4
    users_per_hour: int = 60
    max_devices: int = 10_000
    approval_failures_per_min: float = 10.0
    approval_failure_burst: int = 10


def hmac_hex(key: bytes, challenge: str) -> str:
    """What a board computes: HMAC-SHA256 over the challenge's bytes, lowercase hex."""
    return hmac.new(key, challenge.encode(), hashlib.sha256).hexdigest()


class TrustBook:
    def __init__(
        self,
        config: TrustConfig,
        *,
        bindings: Mapping[str, Binding],
        new_code: Callable[[], str],
        new_challenge: Callable[[], str],
    ) -> None:
        self._config = config
        self._bindings = dict(bindings)
        self._new_code = new_code
        self._new_challenge = new_challenge
        self._pending: dict[str, Pending] = {}  # by code, in expiry order (constant ttl)
        self.revision = 0  # bumped on every change of the bindings (the shell persists them)
        burst = max(1, config.users_per_hour)
        self._creations = TokenBucket(config.users_per_hour / 3600, burst)
        self._failures = TokenBucket(
            config.approval_failures_per_min / 60, config.approval_failure_burst
        )

    @property
    def bindings(self) -> dict[str, Binding]:
        return dict(self._bindings)

    def pending(self, now: float) -> list[Pending]:
        self._expire(now)
        return list(self._pending.values())

    def request(self, dev: str, client_id: str, *, serial: str | None, now: float) -> Decision:
        """An OTA request from ``client_id`` for ``dev``; ``serial`` only when the operator
        provisioned an HMAC key for the board's serial number (then the board must prove it)."""
        cfg = self._config
        if cfg.policy is Policy.ALLOWLIST and dev not in cfg.allowlist:
            return Decision(Verdict.REFUSE, refusal=OtaRefusal.NOT_ALLOWLISTED)
        bound = self._bindings.get(dev)
        if bound is not None and (bound.client_id == client_id or cfg.policy is Policy.OPEN):
            return Decision(
                Verdict.CREDENTIALS, generation=bound.generation, client_id=bound.client_id
            )
        if bound is None and serial is None:
            if len(self._bindings) >= cfg.max_devices:
                return Decision(Verdict.REFUSE, refusal=OtaRefusal.DEVICES_FULL)
            if not self._creations.allow(now):
                return Decision(Verdict.REFUSE, refusal=OtaRefusal.USER_CAP)
            self._bindings[dev] = Binding(client_id)
            self.revision += 1
            return Decision(
                Verdict.CREDENTIALS, generation=1, client_id=client_id, new_binding=True
            )
        return self._activation(dev, client_id, serial, now)

    def approve(self, code: str, now: float) -> tuple[Approval, Pending | None]:
        """An operator or parent confirms ``code``; binds its device to its Client-Id."""
        if self._failures.level(now) < 1:
            return Approval.LOCKED, None
        self._expire(now)
        pending = self._pending.get(code)
        if pending is None:
            self._failures.allow(now)
            return Approval.UNKNOWN, None
        self._bind(pending)
        return Approval.APPROVED, pending

    def activate(
        self,
        dev: str,
        client_id: str,
        *,
        challenge: str | None,
        signature: str | None,
        serial: str | None,
        key: bytes | None,
        now: float,
    ) -> Activation:
        """The board polls ``/activate``: done once bound; a valid HMAC of the challenge from a
        board whose serial has ``key`` binds it at once; otherwise still pending. ``serial`` is
        the one the body claims (``key`` is its key): it must be the serial the challenge was
        issued for, or one board's key would sign for another serial's binding."""
        bound = self._bindings.get(dev)
        if bound is not None and bound.client_id == client_id:
            return Activation.DONE
        self._expire(now)
        pending = self._find(dev, client_id)
        if pending is None:
            return Activation.UNKNOWN
        if (
            signature is None
            or key is None
            or pending.serial is None
            or (bound is not None and bound.serial != pending.serial)  # a key proves a serial,
        ):  # not that it owns this MAC
            return Activation.PENDING
        expected = hmac_hex(key, pending.challenge)
        if (
            serial != pending.serial
            or challenge != pending.challenge
            or not hmac.compare_digest(expected, signature.lower())
        ):
            return Activation.BAD_HMAC
        if bound is None and not self._may_create(now):
            return Activation.PENDING  # a new MAC is a new broker user: first contact's caps
        self._bind(pending, serial=pending.serial)
        return Activation.DONE

    def rotate(self, dev: str) -> Binding | None:
        """Explicit rotation: the next generation's password replaces the current one."""
        bound = self._bindings.get(dev)
        if bound is None:
            return None
        self._bindings[dev] = replace(bound, generation=bound.generation + 1)
        self.revision += 1
        return self._bindings[dev]

    def forget(self, dev: str) -> bool:
        """Drop ``dev``'s binding and pending codes: its next request is a first contact."""
        found = self._bindings.pop(dev, None) is not None
        for code in [c for c, p in self._pending.items() if p.dev == dev]:
            del self._pending[code]
        if found:
            self.revision += 1
        return found

    # -- internals ---------------------------------------------------------------------------

    def _activation(self, dev: str, client_id: str, serial: str | None, now: float) -> Decision:
        self._expire(now)
        existing = self._find(dev, client_id)
        if existing is not None and existing.serial == serial:
            return Decision(Verdict.ACTIVATE, pending=existing)
        if existing is not None:  # same board, serial changed: start over
            del self._pending[existing.code]
        cfg = self._config
        per_device = sum(1 for p in self._pending.values() if p.dev == dev)
        if len(self._pending) >= cfg.max_pending or per_device >= cfg.max_pending_per_device:
            return Decision(Verdict.REFUSE, refusal=OtaRefusal.PENDING_FULL)
        code = self._new_code()
        while code in self._pending:  # a handful of live codes among a million: rare
            code = self._new_code()
        pending = Pending(code, dev, client_id, self._new_challenge(), serial, now + cfg.code_ttl_s)
        self._pending[code] = pending
        return Decision(Verdict.ACTIVATE, pending=pending)

    def _bind(self, pending: Pending, *, serial: str | None = None) -> None:
        bound = self._bindings.get(pending.dev)
        generation = 1 if bound is None else bound.generation + 1
        self._bindings[pending.dev] = Binding(pending.client_id, generation, serial)
        self.revision += 1
        stale = [c for c, p in self._pending.items() if p.dev == pending.dev]
        for code in stale:
            del self._pending[code]

    def _may_create(self, now: float) -> bool:
        """Room for one more binding, drawing on the hourly budget (HMAC activations)."""
        return len(self._bindings) < self._config.max_devices and self._creations.allow(now)

    def _find(self, dev: str, client_id: str) -> Pending | None:
        for pending in self._pending.values():
            if pending.dev == dev and pending.client_id == client_id:
                return pending
        return None

    def _expire(self, now: float) -> None:
        while self._pending:
            code, first = next(iter(self._pending.items()))
            if first.expires > now:
                return
            del self._pending[code]
