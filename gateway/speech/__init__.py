"""SPEAK: text and lesson clips spoken to a Xiaozhi device over its voice channel.

Pure parts: :mod:`gateway.speech.frames` (PCM chunking, the pacing schedule, durations) and
:mod:`gateway.speech.cache` (the bounded phrase cache). The asyncio shell is
:mod:`gateway.speech.service`; the engines (espeak-ng, OpenAI-compatible HTTP TTS, clip
decoding) are :mod:`gateway.speech.engines`. See docs/speech.md.
"""
