"""The task runtime: its pure core (:mod:`gateway.tasks.core`) and the asyncio shell around it
(one actor per device)."""
