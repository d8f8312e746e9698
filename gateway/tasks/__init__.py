"""The task runtime's asyncio shell: one actor per device around the pure ``DeviceRuntime``."""
