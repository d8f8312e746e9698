"""snlp gateway: the asyncio service (runtime, sessions, shells)."""

__version__ = "0.1.0"
