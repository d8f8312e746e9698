"""The demo's second half: a lesson exited mid-way, then a spoken CHAT turn.

After the first lesson completed, the backend starts the lesson again and exits it (control
``stop``, what a parent app's exit button sends) once its first clip played: the instance ends
``cancelled`` and the device is back in CHAT at once. The child then talks to the device: it
opens a turn (``listen start``, auto mode), says "hello", and the gateway answers offline —
its VAD ends the segment, pocketsphinx recognises it, a rule picks the reply, espeak-ng speaks
it and the Opus frames come down the encrypted UDP channel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import aiomqtt

from devstack.demo_report import DemoTimeline
from gateway.chat import espeak
from gateway.simulators.xiaozhi import XiaozhiDeviceSim

CHAT_WAIT_S = 60.0
EXIT_WAIT_S = 30.0


class Speaker(Protocol):
    def say(self, pcm: bytes) -> None: ...


async def exit_then_chat(
    *,
    client: aiomqtt.Client,
    device: XiaozhiDeviceSim,
    uplink: Speaker,
    tl: DemoTimeline,
    dev: str,
    start: dict[str, Any],
    fail: Callable[[str], Exception],
) -> str:
    """Returns the reply the device was told (its ``sentence_start`` text)."""
    await client.publish(f"snlpgw/v1/ctl/{dev}", json.dumps({**start, "id": "demo-start-2"}), qos=1)
    tl.note("backend: start the lesson again (to exit it)")
    instance_id = ""
    async for message in client.messages:
        body = json.loads(message.payload if isinstance(message.payload, bytes) else b"{}")
        event = body.get("event")
        if body.get("ref") == "demo-start-2":
            instance_id = str(body.get("instance_id"))
        elif event == "step.played" and body.get("instance_id") == instance_id:
            stop = {"v": 1, "id": "demo-exit", "action": "stop", "instance_id": instance_id}
            await client.publish(f"snlpgw/v1/ctl/{dev}", json.dumps(stop | {"priority": 3}))
            tl.note("backend: exit (control stop) while clip 1 plays")
        elif event == "instance.cancelled" and body.get("instance_id") == instance_id:
            tl.note(f"lesson cancelled ({body.get('data', {}).get('reason')}): back in CHAT")
            break
    else:
        raise fail("no lesson exit seen")

    seen = len(device.inbox)
    await device.listen_start("auto")
    uplink.say(espeak.synthesize("hello", wpm=150) + espeak.silence(900))
    tl.note('child (CHAT): "hello"')
    try:
        stop = await device.expect("tts", state="stop", after=seen, timeout_s=CHAT_WAIT_S)
    except TimeoutError:
        raise fail("the CHAT turn got no spoken reply") from None
    del stop
    answered = device.inbox[seen:]
    heard = next((m.get("text") for m in answered if m.get("type") == "stt"), None)
    reply = next((m.get("text") for m in answered if m.get("state") == "sentence_start"), None)
    frames = len(device.downlink_audio)
    tl.note(f"gateway heard {heard!r}, replied {reply!r}: {frames} Opus frames played")
    if not frames or not reply:
        raise fail("the CHAT reply carried no speech")
    return str(reply)
