"""The Xiaozhi MQTT+UDP voice channel: OTA provisioning, hello/goodbye sessions over MQTT,
AES-128-CTR Opus over UDP, uplink decode + VAD, paced downlink (reference/xiaozhi-mqtt-udp.md)."""

from gateway.xiaozhi.channel import XiaozhiChannel
from gateway.xiaozhi.downlink import SpeakResult
from gateway.xiaozhi.mcp import McpError, McpTimeout
from gateway.xiaozhi.ota.provisioning import Provisioner
from gateway.xiaozhi.roster import HelloGate, SessionEvents, SessionLink
from gateway.xiaozhi.speaking import NoSession
from gateway.xiaozhi.voice_ports import VoiceSink, utterance_id

__all__ = [
    "HelloGate",
    "McpError",
    "McpTimeout",
    "NoSession",
    "Provisioner",
    "SessionEvents",
    "SessionLink",
    "SpeakResult",
    "VoiceSink",
    "XiaozhiChannel",
    "utterance_id",
]
