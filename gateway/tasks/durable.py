"""Commands that leave only once the store has what they follow (scale-out).

With one gateway a crash loses nothing a restart cares about: the store is behind by a few
milliseconds at most and the same gateway resumes. With several, the gateway taking over a
device resumes from the shared store, so the store must never be behind what the board was
told: a PLAY_MEDIA for step k+1 that left before the close of step k was stored would be played
again by the new owner (and k+1's clip twice). :class:`DurableCommands` holds each command
until every store row submitted before it has been written (:meth:`Store.after_committed`,
one transaction, milliseconds), then hands it to the board channel. Stepping itself never
waits: the runtime's clock runs on; only the command leaves a transaction later.

A store that fails does not hold commands forever: a failed write counts as done (it is
counted and alarmed by the store); the lesson goes on without the durability.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.store import Store
from gateway.tasks.core import DeliveryResult
from gateway.tasks.ports import CommandSender


class DurableCommands:
    """A :class:`~gateway.tasks.ports.CommandSender` in front of another, gated by the store."""

    def __init__(self, inner: CommandSender, store: Store) -> None:
        self._inner = inner
        self._store = store

    def send_command(
        self,
        device: str,
        *,
        command_id: str,
        cmd: str,
        params: Mapping[str, object],
        prio: int,
        on_outcome: Callable[[DeliveryResult], None],
    ) -> None:
        def send() -> None:
            self._inner.send_command(
                device,
                command_id=command_id,
                cmd=cmd,
                params=params,
                prio=prio,
                on_outcome=on_outcome,
            )

        self._store.after_committed(send)
