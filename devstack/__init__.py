"""The one dev stack of the repository: what the demo, the tests and the benchmarks start.

Not part of the shipped package (``pyproject.toml`` ships ``gateway``, ``codec`` and ``topics``
only); it runs from a checkout, where ``catalog/`` and the broker configuration live.

* :mod:`devstack.broker` — Mosquitto with the project's generated config on free ports (the one
  launcher), ready once the gateway user CONNECTs (:func:`gateway.mqtt.probe.connack`, the one probe).
* :mod:`devstack.gateway` — the one settings builder and the one in-process gateway runner.
* :mod:`devstack.process` — the one gateway *process* runner (the load harness, scale-out tests).
* :mod:`devstack.demo` — ``make demo`` (``python -m devstack.demo``).

``snlpgw dev-run`` (``make run``) is shipped and supervises a broker and a gateway *process*
for a developer's terminal; it shares the broker files and the probe with this stack.
"""
