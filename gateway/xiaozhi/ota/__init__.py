"""Xiaozhi OTA and device trust: who gets a device's broker credentials.

``/xiaozhi/ota/`` and ``/xiaozhi/ota/activate`` (:mod:`endpoint`, on the device listener) with
their wire format (:mod:`wire`), rate limits (:mod:`limits`) and counters (:mod:`stats`); the
trust book — policy, activation codes, approvals — as a pure core (:mod:`trust`) and its files
(:mod:`trust_store`); broker users for devices (:mod:`provisioning`); the approval API on the
admin listener (:mod:`admin`). The voice session (hello, UDP, pipeline) is the parent room.
"""
