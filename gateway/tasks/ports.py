"""What the task shell needs from the other components, as small protocols.

The board channel, the Xiaozhi voice channel, the assessment side path and the store implement
these (adapters live in :mod:`gateway.app`); shell unit tests use hand-written fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from gateway.assessment.jobs import AnswerGrammar
from gateway.tasks.core import DeliveryResult, InstanceColumns, PublishTaskEvent, StepColumns


class CommandSender(Protocol):
    """Delivers snlp/v1 commands with acks/resends; reports each command's outcome once."""

    def send_command(
        self,
        device: str,
        *,
        command_id: str,
        cmd: str,
        params: Mapping[str, object],
        prio: int,
        on_outcome: Callable[[DeliveryResult], None],
    ) -> None: ...


class MicControl(Protocol):
    """Tells the voice channel whether anyone needs this device's microphone audio now.

    Turning listening off flushes an utterance still open, so it reaches the sink.
    ``sheddable``: a lesson window the channel may open capture-only under voice overload
    (gateway.xiaozhi.overload), or when ``claim`` (asked only when the device has a voice
    session and the loop admits the window) says the ASR cannot take its answer; its packets
    come back once from :meth:`take_captured`.
    """

    def set_listening(
        self,
        device: str,
        listening: bool,
        *,
        sheddable: bool = False,
        claim: Callable[[], bool] | None = None,
    ) -> None: ...

    def take_captured(self, device: str) -> tuple[bytes, ...] | None:
        """The Opus packets of the device's last capture-only window (None: it was decoded)."""


class ModeListener(Protocol):
    """Told when a task takes the device and when it returns to CHAT (the chat component)."""

    def task_started(self, device: str) -> None: ...

    def back_to_chat(self, device: str, *, listen: bool = True) -> None:
        """``listen`` False: CHAT has the device again but leaves the microphone closed."""


class DeviceTasks(Protocol):
    """Tells a device's own task executor what the task does (the Xiaozhi channel: task/mode
    JSON of the client-architecture plan §11), so its microphone follows the listen windows
    without a board-side mapping. ``record``: the running instance (None once it ended)."""

    def task_event(
        self, device: str, event: PublishTaskEvent, record: InstanceColumns | None
    ) -> None: ...


class Recorder(Protocol):
    """Fire-and-forget persistence (never blocks, never raises into stepping)."""

    def save_instance(self, record: InstanceColumns) -> None: ...

    def save_step(self, record: StepColumns) -> None: ...


class AnswerKeeper(Protocol):
    """The learning record's audio archive (gateway/archive): keeps a step's answer, as the
    device's own Opus packets; O(1), never blocks, never raises."""

    def submit(
        self, *, device: str, instance_id: str, step_index: int, packets: Sequence[bytes]
    ) -> None: ...


class UtteranceSink(Protocol):
    """The assessment side path: ASR on an utterance, then metrics, store and publish."""

    def claim_answer(self, device: str) -> bool:
        """A lesson window opens: True if the ASR can take its answer (decode it), held until
        :meth:`release_answer`; False: capture it only."""

    def release_answer(self, device: str) -> None:
        """The device's lesson window closed."""

    def shed_utterance(
        self,
        *,
        device: str,
        instance_id: str,
        step_index: int,
        reason: str,
        methods: tuple[str, ...],
    ) -> None:
        """A step's answer that will not be assessed now (``reason``): stored and counted."""

    def submit_utterance(
        self,
        *,
        device: str,
        instance_id: str,
        step_index: int,
        utterance_id: str,
        pcm: bytes,
        prompt_text: str | None,
        expected_text: str | None,
        methods: tuple[str, ...],
        hints: tuple[str, ...],
    ) -> None: ...


class SpeakPort(Protocol):
    """SPEAK (gateway.speech): text said on the device through its Xiaozhi voice channel.

    Fire and forget: ``speak_started`` / ``speak_completed`` / ``speak_interrupted`` come back
    into the task inbox (:class:`~gateway.tasks.inbox.TaskInbox`) under ``speak_id``."""

    def speak(self, dev: str, *, speak_id: str, text: str, voice: str) -> None: ...

    def cancel(self, dev: str, speak_id: str) -> None: ...


OnInlineText = Callable[["str | None"], None]


class InlineAssessment(Protocol):
    """Inline assessment (task DSL): ASR at once, and the task's numbers stored and published.

    ``transcribe`` hands ``on_text`` the text or None (failed, shed, or still queued after
    ``max_wait_ms``: withdrawn) later, on the loop; False: ASR is off (nothing will come).
    ``grammar``: the kind of answer, for engines that can constrain recognition to it. ``record`` stores and publishes one answered step:
    its transcript and numbers (the task's metrics and the behaviour signals)."""

    def transcribe_now(
        self,
        *,
        instance_id: str,
        step_index: int,
        utterance_id: str,
        pcm: bytes,
        hints: tuple[str, ...],
        on_text: OnInlineText,
        grammar: AnswerGrammar | None = None,
        max_wait_ms: float | None = None,
    ) -> bool: ...

    def withdraw_inline(self, *, instance_id: str, step_index: int, utterance_id: str) -> None:
        """The task stopped: a job not yet started is never transcribed (nothing delivered)."""
        ...

    def record_inline(
        self,
        *,
        device: str,
        instance_id: str,
        step_index: int,
        prompt_text: str | None,
        expected_text: str | None,
        asr_text: str | None,
        metrics: Mapping[str, float],
    ) -> None: ...
