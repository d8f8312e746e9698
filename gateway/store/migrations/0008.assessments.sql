-- depends: 0001.instances-and-steps
-- Re-assessment (issue #29): each re-run of ASR and metrics on a step's archived answer is kept
-- as its own row, keyed by the engine and its version, beside the step's original assessment
-- (steps.asr_text / steps.metrics stay as they were). A second run with the same engine and
-- version finds its row and changes nothing. One script for SQLite and PostgreSQL.
CREATE TABLE assessments (
    instance_id TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    engine TEXT NOT NULL,
    engine_version TEXT NOT NULL,
    asr_text TEXT,
    metrics TEXT NOT NULL DEFAULT '[]',
    audio_id TEXT,
    assessed_ms BIGINT NOT NULL,
    PRIMARY KEY (instance_id, step_index, engine, engine_version)
);
