"""Address binding rules and downlink pacing: pure cores, table-driven with a fake clock."""

from __future__ import annotations

import pytest

from gateway.xiaozhi.binding import MAX_TOCS, Address, AddressBinding, Admission
from gateway.xiaozhi.downlink import Pacing
from gateway.xiaozhi.ratelimit import HelloLimiter, TokenBucket

HOME: Address = ("10.0.0.5", 40000)
NAT: Address = ("10.0.0.5", 40001)
EVIL: Address = ("192.0.2.66", 5555)
OPUS = b"\x58\x01\x02"  # TOC 0x58: SILK wideband 60 ms


@pytest.mark.parametrize(
    ("history", "source", "now", "expected"),
    [
        ([], HOME, 0.0, Admission.FIRST),
        ([(HOME, 0.0)], HOME, 1.0, Admission.SAME),
        ([(HOME, 0.0)], EVIL, 1.0, Admission.FOREIGN),
        ([(HOME, 0.0)], EVIL, 4.99, Admission.FOREIGN),
        ([(HOME, 0.0)], NAT, 5.0, Admission.REBIND),  # bound source silent >= 5 s
        ([(HOME, 0.0), (HOME, 3.0)], NAT, 7.0, Admission.FOREIGN),  # it spoke at 3 s
        ([(HOME, 0.0), (HOME, 3.0)], NAT, 8.0, Admission.REBIND),
    ],
)
def test_admission(
    history: list[tuple[Address, float]], source: Address, now: float, expected: Admission
) -> None:
    binding = AddressBinding(rebind_after_s=5.0)
    for addr, at in history:
        binding.commit(addr, at, binding.check(addr, at), OPUS)
    assert binding.check(source, now) is expected


def test_check_does_not_mutate_and_rebind_moves_the_binding() -> None:
    binding = AddressBinding(rebind_after_s=5.0)
    binding.commit(HOME, 0.0, Admission.FIRST, OPUS)
    assert binding.check(NAT, 10.0) is Admission.REBIND
    assert binding.address == HOME  # a check alone (e.g. a replay then refused) never rebinds
    binding.commit(NAT, 10.0, Admission.REBIND, b"")
    assert (binding.address, binding.rebinds) == (NAT, 1)
    assert binding.check(HOME, 11.0) is Admission.FOREIGN


def test_foreign_cannot_be_committed() -> None:
    binding = AddressBinding(rebind_after_s=5.0)
    with pytest.raises(ValueError, match="FOREIGN"):
        binding.commit(EVIL, 0.0, Admission.FOREIGN, OPUS)


def test_familiar_frames_start_with_a_toc_byte_already_seen_and_the_set_is_bounded() -> None:
    binding = AddressBinding(rebind_after_s=30.0)
    assert not binding.familiar(OPUS)  # nothing learned yet
    binding.commit(HOME, 0.0, Admission.FIRST, OPUS)
    binding.commit(HOME, 0.1, Admission.SAME, b"")  # not decrypted: nothing to learn
    assert binding.familiar(bytes([OPUS[0]]) + b"other bytes")
    assert not binding.familiar(b"\x00" + OPUS[1:])
    assert not binding.familiar(b"")
    for toc in range(100):
        binding.commit(HOME, 1.0, Admission.SAME, bytes([toc]))
    assert len(binding.tocs) == MAX_TOCS


@pytest.mark.parametrize(
    ("index", "due"),
    [(0, 100.0), (4, 100.0), (5, 100.06), (6, 100.12), (14, 100.6)],
)
def test_pacing_prebuffers_five_then_one_per_frame(index: int, due: float) -> None:
    assert Pacing().due(index, start=100.0) == pytest.approx(due)


def test_pacing_stop() -> None:
    pacing = Pacing(frame_ms=60, prebuffer=5)
    # 10 packets: the last (index 9) is due at +0.30 s, stop follows 7 frames later.
    assert pacing.stop_due(10, 0.0) == pytest.approx(0.30 + 0.42)
    assert pacing.stop_due(0, 3.0) == 3.0
    with pytest.raises(ValueError, match="index"):
        pacing.due(-1, 0.0)


def test_token_bucket_allows_burst_then_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=3)
    assert [bucket.allow(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.allow(0.05) is False  # half a token
    assert bucket.allow(0.1) is True
    assert bucket.allow(0.09) is False  # time going backwards refills nothing
    assert [bucket.allow(100.0) for _ in range(4)] == [True, True, True, False]  # capped at burst


def test_token_bucket_can_start_empty() -> None:
    bucket = TokenBucket(rate=1.0, burst=5, tokens=0.0)
    assert bucket.allow(0.0) is False
    assert bucket.allow(1.0) is True


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 3), (-1.0, 3), (1.0, 0)])
def test_token_bucket_rejects_nonsense(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=rate, burst=burst)


def test_hello_limiter_budgets_each_device_and_forgets_the_least_recent() -> None:
    limiter = HelloLimiter(rate=0.1, burst=2, capacity=3)
    assert [limiter.allow("a", 0.0) for _ in range(3)] == [True, True, False]
    assert limiter.allow("a", 10.0)  # one back after 10 s
    for dev in ("b", "c"):
        assert limiter.allow(dev, 10.0)
    assert limiter.allow("a", 10.0) is False  # "a" is the most recent now; "b" is oldest
    assert limiter.allow("d", 10.0)  # evicts "b": the table stays at 3
    assert len(limiter) == 3
    assert [limiter.allow("b", 10.0) for _ in range(3)] == [True, True, False]  # fresh budget
    with pytest.raises(ValueError, match="capacity"):
        HelloLimiter(rate=1, burst=1, capacity=0)
    with pytest.raises(ValueError, match="rate"):
        HelloLimiter(rate=0, burst=1, capacity=1)


def test_a_new_source_must_send_three_plausible_frames_in_a_row() -> None:
    binding = AddressBinding(rebind_after_s=30.0)
    assert [binding.confirm(NAT) for _ in range(2)] == [False, False]
    binding.refuse()
    assert [binding.confirm(NAT) for _ in range(2)] == [False, False]
    assert binding.confirm(EVIL) is False  # another source starts its own run
    assert [binding.confirm(NAT) for _ in range(3)] == [False, False, True]
    binding.commit(NAT, 40.0, Admission.REBIND, OPUS)
    assert (binding.candidate, binding.confirmed) == (None, 0)
