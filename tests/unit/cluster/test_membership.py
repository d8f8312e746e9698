"""Membership and rendezvous ownership: one owner per device from the same live set, minimal
movement on joins and leaves, nothing owned until settled, stale statuses ignored."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster.membership import Membership, owner_of

DEVICES = [f"aa_bb_cc_dd_{n // 256:02x}_{n % 256:02x}" for n in range(3000)]


def settled(self_id: str, others: list[str], *, now: int = 100) -> Membership:
    m = Membership(self_id)
    m.reset(now)
    for gw in others:
        assert m.update(gw, online=True, ts_ms=now) is False  # before settling: no change yet
    assert m.update(self_id, online=True, ts_ms=now + 1) is True
    return m


def test_every_gateway_computes_the_same_single_owner() -> None:
    gws = ["gw-a", "gw-b", "gw-c"]
    views = [settled(gw, [o for o in gws if o != gw]) for gw in gws]
    for dev in DEVICES[:500]:
        owners = {v.owner(dev) for v in views}
        assert len(owners) == 1
        assert sum(v.owns(dev) for v in views) == 1


def test_load_spreads_evenly() -> None:
    counts = Counter(owner_of(dev, ["gw-a", "gw-b", "gw-c"]) for dev in DEVICES)
    assert set(counts) == {"gw-a", "gw-b", "gw-c"}
    assert all(800 <= c <= 1200 for c in counts.values())  # 1000 each, ±20 %


def test_a_leaving_gateway_moves_only_its_own_devices() -> None:
    before = {dev: owner_of(dev, ["gw-a", "gw-b", "gw-c"]) for dev in DEVICES}
    after = {dev: owner_of(dev, ["gw-a", "gw-c"]) for dev in DEVICES}
    moved = {dev for dev in DEVICES if before[dev] != after[dev]}
    assert moved == {dev for dev in DEVICES if before[dev] == "gw-b"}


def test_a_joining_gateway_takes_only_what_it_wins() -> None:
    before = {dev: owner_of(dev, ["gw-a", "gw-b"]) for dev in DEVICES}
    after = {dev: owner_of(dev, ["gw-a", "gw-b", "gw-c"]) for dev in DEVICES}
    assert all(after[d] in (before[d], "gw-c") for d in DEVICES)


def test_nothing_is_owned_until_our_own_fresh_status_comes_back() -> None:
    m = Membership("gw-a")
    m.reset(1000)
    assert m.update("gw-a", online=False, ts_ms=900) is False  # our old LWT, retained
    assert m.update("gw-a", online=True, ts_ms=950) is False  # older than this connection
    assert not m.settled
    assert m.owner(DEVICES[0]) is None
    assert not m.owns(DEVICES[0])
    assert m.update("gw-a", online=True, ts_ms=1001) is True
    assert m.owns(DEVICES[0])  # alone: everything is ours
    assert m.update("gw-a", online=True, ts_ms=1002) is False  # already settled


def test_leave_and_join_while_settled_are_changes() -> None:
    m = settled("gw-a", ["gw-b"])
    assert m.live == {"gw-a", "gw-b"}
    assert m.update("gw-b", online=True, ts_ms=200) is False  # no news
    assert m.update("gw-b", online=False, ts_ms=300) is True  # its LWT
    assert m.live == {"gw-a"}
    assert m.update("gw-b", online=False, ts_ms=301) is False
    assert m.update("gw-c", online=True, ts_ms=302) is True


def test_an_lwt_counts_though_it_carries_its_connection_time() -> None:
    """The broker writes the LWT composed at CONNECT: older than the online status after it."""
    m = settled("gw-a", [])
    assert m.update("gw-b", online=True, ts_ms=500) is True
    assert m.update("gw-b", online=False, ts_ms=400) is True
    assert m.live == {"gw-a"}


def test_losing_the_broker_owns_nothing_until_settled_again() -> None:
    m = settled("gw-a", ["gw-b"])
    assert m.reset(5000) is True
    assert m.live == frozenset()
    assert not m.owns(DEVICES[0])
    assert m.reset(5001) is False  # already unsettled
    assert m.update("gw-a", online=True, ts_ms=4000) is False  # from before the loss
    assert m.update("gw-b", online=True, ts_ms=5002) is False
    assert m.update("gw-a", online=True, ts_ms=5003) is True
    assert m.live == {"gw-a", "gw-b"}


@given(st.sets(st.sampled_from([f"gw-{c}" for c in "abcdefgh"]), min_size=1), st.text())
def test_owner_is_a_member_and_independent_of_order(members: set[str], dev: str) -> None:
    owner = owner_of(dev, sorted(members))
    assert owner in members
    assert owner == owner_of(dev, sorted(members, reverse=True))


def test_no_member_no_owner() -> None:
    assert owner_of("aa", []) is None
