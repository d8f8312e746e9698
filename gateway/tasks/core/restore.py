"""Resume-after-gateway-restart rule (pure): continue a stored instance or cancel it.

A stored ``running`` instance (or one paused because the board went offline) is resumed when
the board is online and ``now - last activity ≤ grace``: the runtime restarts at the step whose
window had not closed, playing its clip again (a step whose window closed or whose clip failed
is done; the next one starts). Otherwise it is cancelled with reason ``gateway_restart``.
An instance paused by a control request stays paused (its clip plays again on ``resume``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from gateway.tasks.core.catalog import Catalog
from gateway.tasks.core.device import DeviceRuntime
from gateway.tasks.core.effects import (
    InstanceColumns,
    InstanceState,
    PublishTaskEvent,
    RuntimeEffect,
    StepColumns,
    StoreInstance,
)
from gateway.tasks.core.expected import ReadText
from gateway.tasks.core.instance import ActiveInstance
from gateway.tasks.core.rules import RuntimeConfig, clamp_ratio, clamp_speed


def last_activity_ms(instance: InstanceColumns, steps: Sequence[StepColumns]) -> int:
    """The latest epoch-ms time in the instance and its steps."""
    times = [instance.created_ms]
    for s in steps:
        times += [
            t
            for t in (s.played_ms, s.completed_ms, s.window_opened_ms, s.window_closed_ms)
            if t is not None
        ]
    return max(times)


def resume_index(instance: InstanceColumns, steps: Sequence[StepColumns]) -> int:
    """The step to play again: the last one unless its window closed, it failed or it completed
    without a window (repeater); with no steps, the instance's ``start_step``."""
    if not steps:
        start = instance.params.get("start_step", 0)
        return start if isinstance(start, int) else 0
    last = max(steps, key=lambda s: s.step_index)
    done = last.window_closed_ms is not None or last.failure is not None
    done = done or (instance.mode == "PLAY_AUDIO" and last.completed_ms is not None)
    return last.step_index + 1 if done else last.step_index


def restore_runtime(
    instance: InstanceColumns,
    steps: Sequence[StepColumns],
    catalog: Catalog,
    *,
    online: bool,
    now_ms: float,
    wall_offset_ms: float = 0.0,
    config: RuntimeConfig | None = None,
    read_text: ReadText | None = None,
    new_id: Callable[[], str] | None = None,
) -> tuple[DeviceRuntime, list[RuntimeEffect]]:
    """A runtime for ``instance.device_id`` and the effects that resume or cancel the instance."""
    if instance.state not in (InstanceState.RUNNING, InstanceState.PAUSED):
        raise ValueError(f"instance {instance.instance_id} is {instance.state}, not resumable")
    cfg = config or RuntimeConfig()
    runtime = DeviceRuntime(
        instance.device_id,
        catalog,
        config=cfg,
        read_text=read_text,
        new_id=new_id,
        wall_offset_ms=wall_offset_ms,
        online=online,
    )
    task = catalog.get(instance.app_id, instance.task_id)
    lesson = task.lesson(instance.lesson_id) if task else None
    wall_now = round(now_ms + wall_offset_ms)
    by_control = instance.state is InstanceState.PAUSED and instance.reason == "paused"
    fresh = online and wall_now - last_activity_ms(instance, steps) <= cfg.offline_grace_ms
    steps_task = task is not None and task.interaction_mode == "STEPS"  # not resumable
    if task is None or lesson is None or steps_task or not (fresh or by_control):
        ended = replace(
            instance, state=InstanceState.CANCELLED, reason="gateway_restart", ended_ms=wall_now
        )
        event = PublishTaskEvent(
            "instance.cancelled", instance.instance_id, None, {"reason": "gateway_restart"}
        )
        return runtime, [StoreInstance(ended), event]
    ratio = instance.params.get("listen_ratio", task.listen_ratio)
    repeat = instance.params.get("repeat", task.repeat)
    volume = instance.params.get("volume", task.volume)
    speed = instance.params.get("speed", task.speed)
    active = ActiveInstance(
        task,
        lesson,
        instance,
        clamp_ratio(float(ratio)) if isinstance(ratio, int | float) else task.listen_ratio,
        repeat if isinstance(repeat, int) else task.repeat,
        index=resume_index(instance, steps),
        volume=volume if type(volume) is int else task.volume,
        speed=clamp_speed(float(speed)) if isinstance(speed, int | float) else 1.0,
    )
    return runtime, runtime.adopt(active, now_ms, paused=by_control)
