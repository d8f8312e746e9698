"""Lesson content (#28 item 5): lesson audio served to boards over HTTP, app manifests, and
lesson packs synced to the boards' SD cards with DOWNLOAD."""
