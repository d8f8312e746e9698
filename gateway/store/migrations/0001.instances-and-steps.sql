-- Instances and steps (SPEC §5). One script for SQLite and PostgreSQL: times are epoch
-- milliseconds (BIGINT: 64-bit in both), every column but the keys is nullable so a partial
-- update can never fail on a missing value.
CREATE TABLE instances (
    id TEXT PRIMARY KEY NOT NULL,
    device TEXT,
    app_id TEXT,
    task_id TEXT,
    lesson_id TEXT,
    mode TEXT,
    priority INTEGER,
    source TEXT,
    state TEXT CHECK (state IN ('running', 'paused', 'completed', 'cancelled')),
    reason TEXT,
    created_ms BIGINT,
    updated_ms BIGINT,
    ended_ms BIGINT,
    current_step INTEGER,
    resume TEXT
);
CREATE INDEX instances_created ON instances (created_ms DESC, id DESC);
CREATE INDEX instances_device ON instances (device, created_ms DESC);
CREATE INDEX instances_state ON instances (state, created_ms DESC);
CREATE TABLE steps (
    instance_id TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    clip TEXT,
    prompt_text TEXT,
    expected_text TEXT,
    asr_text TEXT,
    metrics TEXT NOT NULL DEFAULT '[]',
    assessed_at BIGINT,
    played_ms BIGINT,
    completed_ms BIGINT,
    duration_ms BIGINT,
    window_ms BIGINT,
    window_opened_ms BIGINT,
    window_planned_close_ms BIGINT,
    window_closed_ms BIGINT,
    failure TEXT,
    PRIMARY KEY (instance_id, step_index)
);
