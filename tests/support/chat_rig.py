"""CHAT end to end: the lesson rig's real gateway, board and backend/ops clients, plus a
firmware-like Xiaozhi device (the simulator) on the same device id and, when bridged, the
xiaozhi server peer as the upstream.

    async with chat_rig(broker, tmp_path, upstream=True) as rig:
        hello = await rig.device.open_audio_channel()
        peer = await rig.peer.session(0)
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.simulators.xiaozhi import MqttInfo, XiaozhiDeviceSim
from gateway.xiaozhi.ota.trust import Binding
from gateway.xiaozhi.ota.trust_store import bindings_path, save_bindings
from tests.support.broker import Broker
from tests.support.lesson_rig import LessonRig, lesson_rig
from tests.support.xiaozhi_server import XiaozhiServerPeer, xiaozhi_server
from topics import mac_colon

TOKEN = "test-token-4b1d"


@dataclass
class ChatRig:
    lesson: LessonRig
    device: XiaozhiDeviceSim
    peer: XiaozhiServerPeer | None
    uuid: str  # the board's UUID: its OTA binding's Client-Id, the third part of its client id

    @property
    def dev(self) -> str:
        return self.lesson.dev

    @property
    def upstream(self) -> XiaozhiServerPeer:
        assert self.peer is not None, "rig built without an upstream"
        return self.peer

    def chat_state(self) -> str | None:
        chat = self.lesson.gw.chat
        device = chat.device(self.dev) if chat else None
        return device.core.state.value if device else None


@contextlib.asynccontextmanager
async def chat_rig(
    broker: Broker,
    tmp: Path,
    *,
    upstream: bool = True,
    sections: dict[str, Any] | None = None,
    bound: bool = True,
    peer_options: dict[str, Any] | None = None,
    **chat: Any,
) -> AsyncIterator[ChatRig]:
    """``chat`` settings over the rig's; ``sections``: other settings sections (e.g. asr);
    ``bound``: the device has an OTA binding (its UUID); ``peer_options``: the server peer's."""
    async with contextlib.AsyncExitStack() as stack:
        options = peer_options if peer_options is not None else {"token": TOKEN}
        peer = await stack.enter_async_context(xiaozhi_server(**options)) if upstream else None
        # tts_lead_s: the firmware (and the simulator) drop audio that arrives before their
        # ``tts start``, which goes through the broker while audio goes straight over UDP; the
        # product's 10 ms is a few broker hops on a quiet host (bench/chat_tts_bench.py), but on
        # a starved CI machine the broker's process may not run for longer than that. These
        # tests are about the turn, not that race: they hold audio long enough for any host.
        settings: dict[str, Any] = {"silence_timeout_s": 30.0, "tts_lead_s": 0.25}
        if peer is not None:
            settings |= {"upstream_url": peer.url, "backoff_min_s": 0.2}
            if peer.token is not None:
                settings["token"] = peer.token
        settings |= chat
        rig = await stack.enter_async_context(
            lesson_rig(
                broker, tmp, durations_ms=(400, 400, 400, 400), chat=settings, **(sections or {})
            )
        )
        board = rig.board
        username, password = board._username, board._password
        device = XiaozhiDeviceSim(mac=mac_colon(rig.dev))
        board_uuid = str(uuid.uuid4())
        if bound:  # what the OTA endpoint keeps when it issues the client id below
            save_bindings(bindings_path(rig.settings.data_dir), {rig.dev: Binding(board_uuid)})
        device.mqtt_info = MqttInfo(
            endpoint=f"{broker.host}:{broker.port}",
            client_id=f"GID_test@@@{rig.dev}@@@{board_uuid}",
            username=username,
            password=password,
            publish_topic=f"device-server/{rig.dev}",
            subscribe_topic=f"devices/p2p/{rig.dev}",
        )
        await stack.enter_async_context(device)
        await rig.board_online()
        yield ChatRig(rig, device, peer, board_uuid)
