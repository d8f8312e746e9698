"""CHAT mode: the default mode a device is in when no task runs (SPEC §5, issue 11).

A device's Xiaozhi voice session is answered either by an upstream xiaozhi WebSocket server
(``chat.upstream_url``, bridged per session) or, offline, by the embedded engine (ASR → a
template reply → espeak-ng → Opus). The voice-session v1 rules are the pure core in
:mod:`gateway.chat.voice`.
"""
