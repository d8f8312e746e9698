"""The task service's MQTT side: control requests in (``snlpgw/v1/ctl/{dev}``, parsed into the
task inbox), replies and task events out (``…/reply/{dev}``, MQTT 5 response topics,
``…/task/{dev}``).

An unreadable request is refused at once with a reply naming why (counted ``ctl_invalid``); a
retained one is ignored (it would run again at every resubscribe); one for a device another
gateway owns is left to that gateway (counted ``runtime_not_owner``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from prometheus_client import Counter

from gateway.mqtt.edge import Handler, Inbound, Publisher
from gateway.tasks.core import (
    ControlAction,
    ControlRefusal,
    ControlReply,
    ControlRequest,
    PublishTaskEvent,
)
from gateway.tasks.inbox import TaskInbox
from topics import (
    CtlReply,
    CtlRequest,
    PayloadError,
    TopicError,
    TopicKind,
    build_topic,
    encode,
    parse_ctl_request,
    parse_topic,
    valid_response_topic,
)
from topics.backend import TASK_EVENT_ADAPTER
from topics.fastwire import task_event_bytes

log = logging.getLogger(__name__)

# MQTT 5 response topics remembered per pending request: as many as the admission line can
# hold at its defaults (2,520 paced requests, each with up to 7 of its device's behind it), so
# a waiting request is still answered where it asked; an evicted route costs only that (the
# reply also goes to the device's reply topic). A few hundred bytes each.
RESPONSE_ROUTES_KEPT = 20_480
SPEECH_STEPS_KEPT = 1_024  # utterances remembered with the step they began in


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TaskMqtt(Publisher, Protocol):
    """The MQTT connection as the task service uses it (shell tests pass a fake)."""

    def route(self, topic_filter: str, handler: Handler, *, qos: int = 1) -> None: ...


#: The ``sync`` control action's handler: (device, app_id, task_id, lesson_id) -> None when the
#: sync job started (or joined), else the refusal (its detail in the reply).
SyncLesson = Callable[[str, str, str, str | None], tuple[ControlRefusal, str] | None]


class TaskWire:
    def __init__(
        self,
        *,
        mqtt: TaskMqtt,
        inbox: TaskInbox,
        owns: Callable[[str], bool],
        ctl_invalid: Counter,
        not_owner: Counter,
        sync: SyncLesson | None = None,
    ) -> None:
        self._sync = sync
        self._mqtt = mqtt
        self._inbox = inbox
        self._owns = owns
        self._m_ctl_invalid = ctl_invalid
        self._m_not_owner = not_owner
        # request id → (response topic, correlation data); bounded, oldest forgotten
        self._responses: OrderedDict[str, tuple[str, bytes | None]] = OrderedDict()
        # utterance id → (instance id, step index) where it began; bounded, oldest dropped
        self._speech_steps: OrderedDict[str, tuple[str, int | None]] = OrderedDict()
        mqtt.route("snlpgw/v1/ctl/+", self.on_ctl, qos=1)

    def on_ctl(self, msg: Inbound) -> None:
        try:
            topic = parse_topic(msg.topic)
        except TopicError:
            self._m_ctl_invalid.labels("topic").inc()
            return
        if topic.kind is not TopicKind.CTL or topic.dev is None:
            return
        if msg.retain:  # a retained request would run again at every (re)subscribe
            self._m_ctl_invalid.labels("retained").inc()
            return
        device = topic.dev
        if not self._owns(device):
            self._m_not_owner.inc()
            return
        response_topic = msg.response_topic
        if response_topic and not valid_response_topic(response_topic):
            # Answered on the device's reply topic only: publishing where a requester says
            # outside the reply tree (or to a wildcard, which the broker disconnects for) is
            # not the requester's to ask.
            self._m_ctl_invalid.labels("response_topic").inc()
            log.warning("ignored response topic %r of a control request", response_topic[:80])
            response_topic = None
        try:
            req = parse_ctl_request(msg.payload)
        except PayloadError as exc:
            self._m_ctl_invalid.labels(exc.reason.value).inc()
            self.send_reply(
                device,
                ControlReply("", "", accepted=False, detail=str(exc)[:200]),
                response=(response_topic, msg.correlation_data),
            )
            return
        if req.action == "sync":  # not a task-runtime action: answered here, at once
            self._on_sync(device, req, (response_topic, msg.correlation_data))
            return
        if response_topic:
            self._responses[req.id] = (response_topic, msg.correlation_data)
            while len(self._responses) > RESPONSE_ROUTES_KEPT:
                self._responses.popitem(last=False)
        self._inbox.control(
            device,
            ControlRequest(
                action=ControlAction(req.action),
                request_id=req.id,
                app_id=req.app_id,
                task_id=req.task_id,
                lesson_id=req.lesson_id,
                priority=req.priority,
                source=req.source or "mqtt",
                params=dict(req.params or {}),
                instance_id=req.instance_id,
            ),
        )

    def _on_sync(
        self, device: str, req: CtlRequest, response: tuple[str | None, bytes | None]
    ) -> None:
        refusal: tuple[ControlRefusal, str] | None = (
            (ControlRefusal.INVALID, "lesson sync is not available on this gateway")
            if self._sync is None
            else self._sync(device, req.app_id or "", req.task_id or "", req.lesson_id)
        )
        reply = (
            ControlReply(req.id, "sync", accepted=True)
            if refusal is None
            else ControlReply(req.id, "sync", accepted=False, reason=refusal[0], detail=refusal[1])
        )
        self.send_reply(device, reply, response=response)

    def speech_event(
        self,
        device: str,
        utterance_id: str,
        name: str,
        data: dict[str, object],
        *,
        now_at: tuple[str, int | None],
    ) -> None:
        """VAD speech events go on the task topic, labelled with the step the utterance began
        in (a window close can cut an utterance after the runtime moved to the next step);
        ``now_at``: the device's (instance id, step index) now."""
        where = self._speech_steps.pop(utterance_id, None) or now_at
        if name == "speech.started":
            self._speech_steps[utterance_id] = where
            while len(self._speech_steps) > SPEECH_STEPS_KEPT:
                self._speech_steps.popitem(last=False)
        self.publish_task_event(device, PublishTaskEvent(name, where[0], where[1], data))

    def publish_task_event(self, device: str, effect: PublishTaskEvent) -> None:
        ts = _now_ms()
        instance_id = effect.instance_id or None
        topic = build_topic(TopicKind.TASK, dev=device)
        fast = task_event_bytes(
            device, effect.event, instance_id, effect.step_index, effect.data, ts_ms=ts
        )
        if fast is not None:  # our own plain event: the models' bytes without the round trip
            self._mqtt.publish(topic, fast, qos=1)
            return
        try:
            message = TASK_EVENT_ADAPTER.validate_python(
                {
                    "ts": ts,
                    "device": device,
                    "event": effect.event,
                    "instance_id": instance_id,
                    "step_index": effect.step_index,
                    "data": dict(effect.data),
                }
            )
        except ValueError:
            log.exception("task event %s does not fit the contract", effect.event)
            return
        self._mqtt.publish(topic, encode(message), qos=1)

    def publish_reply(self, device: str, reply: ControlReply) -> None:
        self.send_reply(device, reply, response=self._responses.pop(reply.request_id, None))

    def send_reply(
        self,
        device: str,
        reply: ControlReply,
        *,
        response: tuple[str | None, bytes | None] | None,
    ) -> None:
        accepted = reply.accepted
        body = CtlReply(
            ref=reply.request_id or None,
            device=device,
            action=reply.action or None,  # type: ignore[arg-type]  # runtime actions are Literal-valid
            status="accepted" if accepted else "refused",
            instance_id=reply.instance_id,
            reason=None if accepted else (reply.reason.value if reply.reason else "invalid"),
            running_priority=reply.running_priority,
            detail=reply.detail,
            ts=_now_ms(),
        )
        payload = encode(body)
        # Always on the device's reply topic; also on an MQTT 5 response topic when the request
        # named one (with its correlation data), once if it is the reply topic itself.
        mqtt = self._mqtt
        reply_topic = build_topic(TopicKind.REPLY, dev=device)
        response_topic, correlation = response if response is not None else (None, None)
        if response_topic == reply_topic:
            mqtt.publish(reply_topic, payload, qos=1, correlation_data=correlation)
            return
        mqtt.publish(reply_topic, payload, qos=1)
        if response_topic:
            mqtt.publish(response_topic, payload, qos=1, correlation_data=correlation)
