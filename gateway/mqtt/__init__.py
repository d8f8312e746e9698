"""The gateway's MQTT 5 client and broker connection, one package (see ``docs/mqtt.md``).

* :mod:`~gateway.mqtt.codec` — packet bytes in and out, sans-I/O.
* :mod:`~gateway.mqtt.topics` — topic filter matching for the gateway's routes.
* :mod:`~gateway.mqtt.options` — what a connection is opened with, and how it fails.
* :mod:`~gateway.mqtt.client` — the asyncio shell: one protocol over one socket.
* :mod:`~gateway.mqtt.outbound` — the bounded publish lanes and their pipelined pump.
* :mod:`~gateway.mqtt.connection` — the service's connection: routes, lanes, reconnects.
* :mod:`~gateway.mqtt.tls` — TLS to the broker: the SSLContext from the settings, its failures.
* :mod:`~gateway.mqtt.edge` — what components see of it (``Inbound``, ``Handler``, ``Publisher``).
* :mod:`~gateway.mqtt.probe` — the blocking CONNECT probe of dev-run, the CLI, doctor and OTA
  (the session core over one blocking socket: no thread, no event loop).
"""
