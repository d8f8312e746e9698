"""Concealment amplification (issue 10, item 5): forged sequence jumps used to make the decoder
synthesize up to 999 frames (~11 ms of CPU and ~2 MB of PCM) per datagram."""

from __future__ import annotations

import pytest

from gateway.simulators.xiaozhi import FRAME_MS, encode_pcm
from tests.adversarial.udp_support import forged, live_of, ssrc_of
from tests.integration.test_xiaozhi_audio import BOUNDARY_MS
from tests.integration.xiaozhi_support import provisioned_device, running_gateway
from tests.support import speech
from tests.support.broker import Broker
from tests.support.udp_watch import DatagramWatch

pytestmark = pytest.mark.integration

JUMP = 999  # within the receiver's forward window (1000): accepted, the gap reported as loss
FORGED = 50
RESUME_GAP = 6  # frames the device skips after the attack: over the 5 the decoder conceals


async def test_forged_sequence_jumps_cost_one_frame_of_work_each(broker: Broker) -> None:
    """Attack: from the device's own address, an injector sends keyless datagrams that each
    jump the sequence 999 frames ahead, so the decoder would conceal 998 frames per datagram.
    Defence: a gap over 5 frames resets the decoder instead (decoder_resets counts each), so
    no forged datagram costs more than its own frame, and stream time after the gap is exact."""
    # A forged payload decrypts to random bytes, and about one in four is a packet libopus
    # decodes (into noise, with a ringing tail in the frames decoded after it). So the device
    # resumes after a gap of its own (a reset): continuing straight after the last forged frame
    # put that random noise, in about 2.5 % of runs, into an utterance of its own or into the
    # speech's start, which is chance, not the defence.
    timeline = speech.compose([400, "Count me in.", 900])
    packets = encode_pcm(timeline.pcm)
    async with running_gateway(broker) as gw, provisioned_device(gw) as (dev, sim):
        await sim.open_audio_channel()
        await sim.listen_start()
        assert sim.crypto is not None
        crypto = sim.crypto
        watch = DatagramWatch(gw.channel)
        for packet in packets[:5]:
            sim.send_datagram(crypto.seal(packet))
        live = live_of(gw.channel, sim)
        await watch.until(lambda: live.receiver.accepted == 5)
        seq = crypto.local_sequence
        for _ in range(FORGED):
            seq += JUMP
            sim.send_datagram(forged(ssrc_of(sim), seq))  # same source address as the device
        await watch.until(lambda: live.receiver.accepted == 5 + FORGED)
        # The device carries on past the forged sequence, after a gap the decoder resets on
        # (sentinel: its speech is cut only once every earlier frame went through the decoder,
        # in order).
        crypto.local_sequence = seq + RESUME_GAP
        await sim.stream_opus(packets, speed=10)
        await gw.recorder.wait_for(lambda: len(gw.recorder.utterances_of(dev)) >= 1)
        concealed = gw.metric("xiaozhi_opus_frames_concealed_total")
        resets = gw.metric("xiaozhi_opus_decoder_resets_total")
        errors = gw.metric("xiaozhi_opus_decode_errors_total")
        (utterance,) = gw.recorder.utterances_of(dev)
    assert resets == FORGED + 1  # one per forged jump, one where the device resumed
    # A rejected forged payload costs one concealed frame; nothing else is synthesized.
    assert concealed == errors <= FORGED
    # Before: 998 concealed frames per forged datagram (49,900 here).
    assert concealed < FORGED * (JUMP - 1) / 100
    # Stream time restarts exactly at the frame after the gap: the utterance is where it is.
    base_ms = (seq + RESUME_GAP) * FRAME_MS
    (want,) = timeline.utterances
    assert abs(utterance.start_ms - base_ms - want.start_ms) <= BOUNDARY_MS
    assert abs(utterance.end_ms - base_ms - want.end_ms) <= BOUNDARY_MS
