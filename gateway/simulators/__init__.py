"""Device simulators: real MQTT/UDP clients that behave like boards."""
