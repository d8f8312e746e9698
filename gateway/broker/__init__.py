"""The local Mosquitto broker's files: users, passwords, ACL, config, reloads.

* :mod:`gateway.broker.rules` — pure: roles, name rules, topic grants, ``$7$`` hashes, the text
  of the password, ACL and config files.
* :mod:`gateway.broker.io` — file primitives (lock, atomic write) and broker reload hooks.
* :mod:`gateway.broker.layout` — where each file lives under ``<data_dir>``, and what the
  generated config says (listener ports).
* :mod:`gateway.broker.registry` — the user registry (name → role) and the files it implies.
* :mod:`gateway.broker.credentials` — the API: init, provision, ensure, revoke.

The command line face (``snlpgw broker init``, ``snlpgw provision``) is :mod:`gateway.cli.broker`.
"""
