"""The Xiaozhi MQTT+UDP voice channel: OTA provisioning, hello/goodbye sessions over MQTT,
AES-128-CTR Opus over UDP, uplink decode + VAD, paced downlink (reference/xiaozhi-mqtt-udp.md)."""

from gateway.xiaozhi.channel import NoSession, XiaozhiChannel
from gateway.xiaozhi.control import SessionEvents
from gateway.xiaozhi.downlink import SpeakResult
from gateway.xiaozhi.mcp import McpError, McpTimeout
from gateway.xiaozhi.pipeline import VoiceSink, utterance_id
from gateway.xiaozhi.provisioning import Provisioner

__all__ = [
    "McpError",
    "McpTimeout",
    "NoSession",
    "Provisioner",
    "SessionEvents",
    "SpeakResult",
    "VoiceSink",
    "XiaozhiChannel",
    "utterance_id",
]
