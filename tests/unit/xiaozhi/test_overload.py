"""Decode admission under voice overload: the CoDel-style verdict, the AIMD share, the
deterministic admission, the lag probe on a real loop, and the channel opening lesson windows
capture-only (the session's own decrypted packets kept, nothing decoded)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from gateway.metrics import Metrics
from gateway.xiaozhi.overload import (
    DecodeAdmission,
    DecodeAdmissionConfig,
    LagProbe,
    VoiceGovernor,
)
from gateway.xiaozhi.roster import CAPTURES_LEFT
from tests.unit.xiaozhi.fakes import sample
from tests.unit.xiaozhi.test_udp_shell import DEV, HOME, UdpRig, seal

CONFIG = DecodeAdmissionConfig(target_ms=10, interval_ms=100, step=0.25, decrease=0.5)


class Probes:
    """Feeds probes 20 ms apart; an interval of 100 ms ends at its fifth probe."""

    def __init__(self, admission: DecodeAdmission, first_lag: float) -> None:
        self.admission, self.now = admission, 0.0
        assert admission.observe(0.0, first_lag) is None  # the first interval starts

    def interval(self, lags: list[float]) -> bool | None:
        verdict = None
        for lag in lags:
            self.now += 20
            verdict = self.admission.observe(self.now, lag)
        return verdict


def test_an_interval_is_overloaded_only_when_every_probe_was_late() -> None:
    admission = DecodeAdmission(CONFIG)
    probes = Probes(admission, 50)
    assert probes.interval([50, 50, 50, 50]) is None  # 80 ms: the interval runs on
    assert probes.interval([50]) is True  # 100 ms: every probe above 10 ms
    assert admission.share == 0.5
    assert probes.interval([50, 3, 50, 50, 50]) is False  # one probe on time: calm
    assert admission.share == 0.75
    assert admission.overloaded_intervals == 1


def test_the_share_halves_to_nothing_and_climbs_back_by_steps() -> None:
    admission = DecodeAdmission(CONFIG)
    probes = Probes(admission, 40)
    shares = []
    for _ in range(4):  # overloaded: 0.5, 0.25, 0.125, then below half a step: 0
        assert probes.interval([40] * 5) is True
        shares.append(admission.share)
    assert shares == [0.5, 0.25, 0.125, 0.0]
    for _ in range(5):  # calm: +0.25 each, capped at 1
        assert probes.interval([0] * 5) is False
        shares.append(admission.share)
    assert shares[4:] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_windows_are_admitted_in_the_share_deterministically() -> None:
    admission = DecodeAdmission(CONFIG)
    assert all(admission.admit() for _ in range(5))  # share 1
    admission.share = 0.25
    assert [admission.admit() for _ in range(8)] == [False, False, False, True] * 2
    admission.share = 0.0
    assert not any(admission.admit() for _ in range(10))


def test_target_zero_turns_admission_off() -> None:
    admission = DecodeAdmission(DecodeAdmissionConfig(target_ms=0))
    admission.share = 0.0  # whatever the share, every window is decoded
    assert not admission.enabled
    assert admission.admit()


@pytest.mark.parametrize(
    "kwargs",
    [{"target_ms": -1}, {"interval_ms": 0}, {"step": 0}, {"step": 1.5}, {"decrease": 1}],
)
def test_a_nonsensical_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        DecodeAdmissionConfig(**kwargs)


async def test_the_probe_measures_how_late_a_blocked_loop_ran_it() -> None:
    seen: list[float] = []
    done = asyncio.Event()

    def observe(_now_ms: float, lag_ms: float) -> None:
        seen.append(lag_ms)
        if len(seen) == 2:
            done.set()

    loop = asyncio.get_running_loop()
    async with asyncio.TaskGroup() as tg:
        probe = tg.create_task(LagProbe(observe, period_s=0.01).run())
        # Due before the probe's first wake-up: the loop is busy 100 ms, so that wake-up is
        # at least 90 ms late whatever the machine's load.
        loop.call_later(0.005, time.sleep, 0.1)
        await done.wait()
        probe.cancel()
    assert seen[0] >= 90.0
    assert seen[1] >= 0.0


def test_the_channel_opens_a_lesson_window_capture_only_when_nothing_is_admitted() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    rig.channel.overload.admission.share = 0.0  # as after overloaded intervals
    rig.channel.set_listening(DEV, True, sheddable=True)
    for i in range(3):
        rig.feed(seal(device, f"opus-{i}".encode()), HOME)
    assert live.pipeline.queued == 0  # nothing for the decoder
    rig.channel.set_listening(DEV, False)
    assert rig.channel.take_captured(DEV) == (b"opus-0", b"opus-1", b"opus-2")
    assert rig.channel.take_captured(DEV) is None
    assert sample(rig.metrics, "xiaozhi_lesson_windows_total", mode="captured") == 1
    assert sample(rig.metrics, "xiaozhi_opus_frames_captured_total") == 3
    # CHAT and task-DSL windows are not sheddable: decoded whatever the share.
    rig.channel.set_listening(DEV, True)
    rig.feed(seal(device, b"opus-3"), HOME)
    assert live.pipeline.queued == 1
    assert rig.channel.take_captured("aa_bb_cc_dd_ee_99") is None  # no session: nothing


def test_with_room_a_lesson_window_is_decoded() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    rig.channel.set_listening(DEV, True, sheddable=True)
    rig.feed(seal(device, b"opus"), HOME)
    assert live.pipeline.queued == 1
    rig.channel.set_listening(DEV, False)
    assert rig.channel.take_captured(DEV) is None
    assert sample(rig.metrics, "xiaozhi_lesson_windows_total", mode="decoded") == 1


def test_a_lesson_window_whose_claim_is_refused_is_captured_and_asked_only_if_admitted() -> None:
    rig = UdpRig()
    live, device = rig.open(DEV)
    asked: list[bool] = []

    def claim(answer: bool) -> Callable[[], bool]:
        def ask() -> bool:
            asked.append(answer)
            return answer

        return ask

    rig.channel.set_listening(DEV, True, sheddable=True, claim=claim(False))
    rig.feed(seal(device, b"opus-a"), HOME)
    assert live.pipeline.queued == 0  # the ASR could not take the answer: not decoded
    rig.channel.set_listening(DEV, False)
    assert rig.channel.take_captured(DEV) == (b"opus-a",)
    assert sample(rig.metrics, "xiaozhi_lesson_windows_total", mode="unclaimed") == 1
    rig.channel.set_listening(DEV, True, sheddable=True, claim=claim(True))
    rig.feed(seal(device, b"opus-b"), HOME)
    assert live.pipeline.queued == 1
    rig.channel.set_listening(DEV, False)
    rig.channel.overload.admission.share = 0.0  # the loop admits nothing: the ASR not asked
    rig.channel.set_listening(DEV, True, sheddable=True, claim=claim(True))
    rig.channel.set_listening("aa_bb_cc_dd_ee_99", True, sheddable=True, claim=claim(True))
    assert asked == [False, True]  # nor for a device without a voice session
    assert sample(rig.metrics, "xiaozhi_lesson_windows_total", mode="captured") == 1


async def test_the_governor_puts_its_verdicts_on_the_metrics() -> None:
    metrics = Metrics()
    governor = VoiceGovernor(CONFIG, metrics)
    assert sample(metrics, "xiaozhi_decode_share") == 1.0
    for now, lag in ((0, 30), (50, 30), (100, 30), (150, 0), (200, 0)):
        governor._observe(now, lag)  # the probe's callback
    assert sample(metrics, "xiaozhi_overloaded_intervals_total") == 1
    assert sample(metrics, "xiaozhi_decode_share") == 0.75  # halved, then a calm interval
    off = VoiceGovernor(DecodeAdmissionConfig(target_ms=0), Metrics())
    async with asyncio.TaskGroup() as tg:  # off: no probe runs; the task only waits
        task = tg.create_task(off.run())
        await asyncio.sleep(0.01)
        assert not task.done()
        task.cancel()
        probing = tg.create_task(governor.run())  # on: its probe runs (probes every 50 ms)
        await asyncio.sleep(0.01)
        probing.cancel()


def test_a_capture_left_by_a_closed_session_is_kept_once_and_bounded() -> None:
    rig = UdpRig()
    rig.channel.overload.admission.share = 0.0
    _, device = rig.open(DEV)
    rig.channel.set_listening(DEV, True, sheddable=True)
    rig.feed(seal(device, b"opus-0"), HOME)
    assert rig.channel.close_session(DEV)  # the device leaves mid-answer
    rig.channel.set_listening(DEV, False)  # then the window closes
    assert rig.channel.take_captured(DEV) == (b"opus-0",)
    assert rig.channel.take_captured(DEV) is None
    _, device = rig.open(DEV)
    rig.channel.set_listening(DEV, True, sheddable=True)
    rig.feed(seal(device, b"opus-1"), HOME)
    rig.channel.close_session(DEV)
    rig.channel.set_listening(DEV, True, sheddable=True)  # a new window: the old one is stale
    assert rig.channel.take_captured(DEV) is None
    for i in range(CAPTURES_LEFT + 6):  # many devices leaving mid-window: the oldest go
        dev = f"aa_bb_cc_dd_{i // 256:02x}_{i % 256:02x}"
        _, device = rig.open(dev)
        rig.channel.set_listening(dev, True, sheddable=True)
        rig.feed(seal(device, f"o{i}".encode()), HOME)
        rig.channel.close_session(dev)
    assert rig.channel.take_captured("aa_bb_cc_dd_00_00") is None
    assert rig.channel.take_captured(f"aa_bb_cc_dd_00_{CAPTURES_LEFT + 5:02x}") == (
        f"o{CAPTURES_LEFT + 5}".encode(),
    )
    assert len(rig.channel._roster._left) == CAPTURES_LEFT - 1
