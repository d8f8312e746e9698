-- depends: 0001.instances-and-steps
-- The learning record's audio archive (issue #29): each step's answer is kept as an Ogg Opus
-- blob (gateway/archive), named by its content hash; the step row points at it and the audio
-- table says whose it is, when it was made and how big it is (retention, per-device quota,
-- forget). One script for SQLite and PostgreSQL.
ALTER TABLE steps ADD COLUMN audio_id TEXT;
CREATE TABLE audio (
    id TEXT PRIMARY KEY NOT NULL,
    device TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    created_ms BIGINT NOT NULL,
    size_bytes BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL
);
CREATE INDEX audio_device ON audio (device, created_ms);
CREATE INDEX audio_created ON audio (created_ms);
CREATE INDEX audio_step ON audio (instance_id, step_index);
