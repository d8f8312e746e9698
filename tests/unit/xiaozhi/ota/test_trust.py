"""The OTA trust book (pure core, fake clock): binding, activation codes, approval, HMAC."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from gateway.xiaozhi.ota.trust import (
    Activation,
    Approval,
    Binding,
    OtaRefusal,
    Policy,
    TrustBook,
    TrustConfig,
    Verdict,
    hmac_hex,
)

DEV, OTHER = "aa_bb_cc_00_00_01", "aa_bb_cc_00_00_02"
BOARD, SPOOF, SPOOF2 = "uuid-board", "uuid-spoof", "uuid-spoof-2"
KEY = bytes(range(32))
SERIAL = "SN-0001"


def codes(*fixed: str) -> Iterator[str]:
    yield from fixed
    for n in itertools.count(100_000):
        yield str(n)


def book(
    *,
    bindings: dict[str, Binding] | None = None,
    code_list: tuple[str, ...] = (),
    **config: object,
) -> TrustBook:
    it = codes(*code_list)
    challenges = (f"challenge-{n}" for n in itertools.count())
    return TrustBook(
        TrustConfig(**config),  # type: ignore[arg-type]
        bindings=bindings or {},
        new_code=lambda: next(it),
        new_challenge=lambda: next(challenges),
    )


def test_first_contact_binds_and_the_bound_client_keeps_its_generation() -> None:
    b = book()
    first = b.request(DEV, BOARD, serial=None, now=0)
    assert (first.verdict, first.generation, first.new_binding) == (Verdict.CREDENTIALS, 1, True)
    assert first.client_id == BOARD
    assert b.revision == 1
    again = b.request(DEV, BOARD, serial=None, now=1)
    assert (again.verdict, again.generation, again.new_binding) == (Verdict.CREDENTIALS, 1, False)
    assert b.revision == 1
    assert b.bindings == {DEV: Binding(BOARD, 1)}


def test_another_client_gets_one_stable_activation_and_never_credentials() -> None:
    b = book(bindings={DEV: Binding(BOARD, 3)}, code_list=("123456",))
    first = b.request(DEV, SPOOF, serial=None, now=0)
    assert first.verdict is Verdict.ACTIVATE
    assert first.pending is not None
    assert (first.pending.code, first.pending.challenge) == ("123456", "challenge-0")
    again = b.request(DEV, SPOOF, serial=None, now=10)
    assert again.pending == first.pending  # the board polls: same code until it expires
    assert b.request(DEV, BOARD, serial=None, now=11).generation == 3  # real board unaffected
    assert b.bindings[DEV] == Binding(BOARD, 3)


def test_approval_binds_the_new_client_with_the_next_generation() -> None:
    b = book(bindings={DEV: Binding(BOARD, 1)}, code_list=("111111", "222222"))
    b.request(DEV, SPOOF, serial=None, now=0)
    b.request(DEV, SPOOF2, serial=None, now=0)
    assert b.activate(DEV, SPOOF, challenge=None, signature=None, serial=None, key=None, now=1) is (
        Activation.PENDING
    )
    outcome, pending = b.approve("111111", now=1)
    assert outcome is Approval.APPROVED
    assert pending is not None
    assert pending.client_id == SPOOF
    assert b.bindings[DEV] == Binding(SPOOF, 2)
    assert b.pending(now=1) == []  # the device's other codes are void
    assert b.activate(DEV, SPOOF, challenge=None, signature=None, serial=None, key=None, now=2) is (
        Activation.DONE
    )
    old = b.request(DEV, BOARD, serial=None, now=2)
    assert old.verdict is Verdict.ACTIVATE  # the previous holder is out


def test_codes_expire_and_unknown_codes_are_counted_failures() -> None:
    b = book(bindings={DEV: Binding(BOARD)}, code_list=("111111",) * 3 + ("333333",), code_ttl_s=60)
    b.request(DEV, SPOOF, serial=None, now=0)
    assert b.approve("111111", now=60) == (Approval.UNKNOWN, None)  # expired at 60
    assert b.activate(
        DEV, SPOOF, challenge=None, signature=None, serial=None, key=None, now=61
    ) is (Activation.UNKNOWN)
    b.request(DEV, SPOOF, serial=None, now=61)  # a new code; a colliding draw is redrawn
    b.request(DEV, SPOOF2, serial=None, now=61)
    assert sorted(p.code for p in b.pending(now=61)) == ["111111", "333333"]


def test_wrong_codes_lock_approvals_until_the_failure_bucket_refills() -> None:
    b = book(
        bindings={DEV: Binding(BOARD)},
        code_list=("654321",),
        approval_failures_per_min=6,
        approval_failure_burst=3,
        code_ttl_s=3600,
    )
    b.request(DEV, SPOOF, serial=None, now=0)
    assert [b.approve(f"{n:06d}", now=0)[0] for n in range(4)] == [Approval.UNKNOWN] * 3 + [
        Approval.LOCKED
    ]
    assert b.approve("654321", now=0) == (Approval.LOCKED, None)  # even the right one
    assert b.approve("654321", now=10)[0] is Approval.APPROVED  # one token back after 10 s


def test_pending_codes_are_bounded_in_all_and_per_device() -> None:
    b = book(max_pending=3, max_pending_per_device=2)
    for dev in (DEV, OTHER):
        b.request(dev, BOARD, serial=None, now=0)
    b.request(DEV, "c1", serial=None, now=0)
    b.request(DEV, "c2", serial=None, now=0)
    refused = b.request(DEV, "c3", serial=None, now=0)
    assert (refused.verdict, refused.refusal) == (Verdict.REFUSE, OtaRefusal.PENDING_FULL)
    b.request(OTHER, "c4", serial=None, now=0)
    assert b.request(OTHER, "c5", serial=None, now=0).refusal is OtaRefusal.PENDING_FULL


def test_new_devices_are_capped_per_hour_and_in_all() -> None:
    b = book(users_per_hour=2, max_devices=3)
    macs = [f"aa_bb_cc_00_00_{n:02x}" for n in range(5)]
    verdicts = [b.request(m, BOARD, serial=None, now=0).refusal for m in macs[:3]]
    assert verdicts == [None, None, OtaRefusal.USER_CAP]
    assert b.request(macs[2], BOARD, serial=None, now=1800).refusal is None  # 1 refilled
    assert b.request(macs[3], BOARD, serial=None, now=7200).refusal is OtaRefusal.DEVICES_FULL
    assert len(b.bindings) == 3


def test_allowlist_refuses_unlisted_macs_before_anything_else() -> None:
    b = book(policy=Policy.ALLOWLIST, allowlist=frozenset({DEV}))
    assert b.request(OTHER, BOARD, serial=None, now=0).refusal is OtaRefusal.NOT_ALLOWLISTED
    assert b.request(DEV, BOARD, serial=None, now=0).verdict is Verdict.CREDENTIALS
    assert b.request(DEV, SPOOF, serial=None, now=0).verdict is Verdict.ACTIVATE
    assert list(b.bindings) == [DEV]


def test_open_policy_serves_every_client_the_bound_generation() -> None:
    b = book(policy=Policy.OPEN, bindings={DEV: Binding(BOARD, 4)})
    decision = b.request(DEV, SPOOF, serial=None, now=0)
    assert (decision.verdict, decision.generation) == (Verdict.CREDENTIALS, 4)
    assert decision.client_id == BOARD  # the bound board's password, not one per caller
    assert b.bindings[DEV].client_id == BOARD


def test_hmac_v2_binds_on_first_contact_only_with_a_valid_signature() -> None:
    b = book()
    decision = b.request(DEV, BOARD, serial=SERIAL, now=0)
    assert decision.verdict is Verdict.ACTIVATE
    assert decision.pending is not None
    challenge = decision.pending.challenge
    bad = b.activate(
        DEV, BOARD, challenge=challenge, signature="00" * 32, serial=SERIAL, key=KEY, now=1
    )
    assert bad is Activation.BAD_HMAC
    other = b.activate(
        DEV,
        BOARD,
        challenge="not-it",
        signature=hmac_hex(KEY, "not-it"),
        serial=SERIAL,
        key=KEY,
        now=1,
    )
    assert other is Activation.BAD_HMAC  # a signature over another challenge
    own = b.activate(  # another serial's key signing for this serial's challenge
        DEV,
        BOARD,
        challenge=challenge,
        signature=hmac_hex(KEY, challenge),
        serial="SN-X",
        key=KEY,
        now=1,
    )
    assert own is Activation.BAD_HMAC
    good = hmac_hex(KEY, challenge).upper()
    assert b.activate(
        DEV, BOARD, challenge=challenge, signature=good, serial=SERIAL, key=KEY, now=1
    ) is (Activation.DONE)
    assert b.bindings[DEV] == Binding(BOARD, 1, SERIAL)
    assert b.request(DEV, BOARD, serial=SERIAL, now=2).verdict is Verdict.CREDENTIALS


def test_hmac_v2_rebinds_the_same_serial_but_never_claims_another_boards_mac() -> None:
    b = book(bindings={DEV: Binding(BOARD, 1, SERIAL), OTHER: Binding(BOARD, 1)})
    reset = b.request(DEV, SPOOF, serial=SERIAL, now=0).pending  # factory reset: new UUID
    assert reset is not None
    sig = hmac_hex(KEY, reset.challenge)
    assert b.activate(
        DEV, SPOOF, challenge=reset.challenge, signature=sig, serial=SERIAL, key=KEY, now=1
    ) is (Activation.DONE)
    assert b.bindings[DEV] == Binding(SPOOF, 2, SERIAL)
    claim = b.request(OTHER, SPOOF, serial=SERIAL, now=1).pending  # OTHER was bound without it
    assert claim is not None
    sig = hmac_hex(KEY, claim.challenge)
    assert b.activate(
        OTHER, SPOOF, challenge=claim.challenge, signature=sig, serial=SERIAL, key=KEY, now=2
    ) is (Activation.PENDING)
    assert b.bindings[OTHER] == Binding(BOARD, 1)


def test_a_serial_change_restarts_the_activation() -> None:
    b = book(bindings={DEV: Binding(BOARD)}, code_list=("111111", "222222"))
    first = b.request(DEV, SPOOF, serial=None, now=0).pending
    second = b.request(DEV, SPOOF, serial=SERIAL, now=1).pending
    assert first is not None
    assert second is not None
    assert (first.code, second.code, second.serial) == ("111111", "222222", SERIAL)
    assert [p.code for p in b.pending(now=1)] == ["222222"]
    # a code-only pending cannot be completed by a signature, however valid
    no_serial = b.activate(DEV, SPOOF, challenge="x", signature="y", serial=None, key=None, now=2)
    assert no_serial is Activation.PENDING


def test_rotate_moves_a_bound_device_to_the_next_generation() -> None:
    b = book(bindings={DEV: Binding(BOARD, 1)})
    assert b.rotate(OTHER) is None
    assert b.rotate(DEV) == Binding(BOARD, 2)
    assert b.revision == 1
    assert b.request(DEV, BOARD, serial=None, now=0).generation == 2


def test_forget_unbinds_and_voids_codes_so_the_next_request_is_a_first_contact() -> None:
    b = book(bindings={DEV: Binding(BOARD, 5)})
    b.request(DEV, SPOOF, serial=None, now=0)
    assert b.forget(OTHER) is False
    assert b.revision == 0
    assert b.forget(DEV) is True
    assert (b.bindings, b.pending(now=0), b.revision) == ({}, [], 1)
    fresh = b.request(DEV, SPOOF, serial=None, now=1)
    assert (fresh.verdict, fresh.generation, fresh.new_binding) == (Verdict.CREDENTIALS, 1, True)


def test_hmac_v2_new_bindings_draw_on_the_first_contact_caps() -> None:
    b = book(users_per_hour=1, max_devices=2, bindings={OTHER: Binding(BOARD)})

    def signed(dev: str, now: float) -> Activation:
        pending = b.request(dev, BOARD, serial=SERIAL, now=now).pending
        assert pending is not None
        sig = hmac_hex(KEY, pending.challenge)
        return b.activate(
            dev, BOARD, challenge=pending.challenge, signature=sig, serial=SERIAL, key=KEY, now=now
        )

    assert signed(DEV, 0) is Activation.DONE  # the hour's one new user
    third = "24_0a_c4_00_00_03"
    assert b.forget(DEV)
    assert signed(third, 1) is Activation.PENDING  # budget spent
    assert signed(third, 3600) is Activation.DONE  # refilled
    assert signed(DEV, 7200) is Activation.PENDING  # table full (max_devices 2)
    assert set(b.bindings) == {OTHER, third}
