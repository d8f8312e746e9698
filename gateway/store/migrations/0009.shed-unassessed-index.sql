-- depends: 0007.assessment-shed
-- Catch-up assessment (issue #29): the gateway looks for steps shed under load whose answer
-- nobody has assessed since, every few seconds while its ASR is idle. A partial index keeps
-- that lookup to those few rows however long the learning record grows. One script for SQLite
-- (3.8+) and PostgreSQL.
CREATE INDEX steps_shed_unassessed ON steps (instance_id)
    WHERE assessment_shed IS NOT NULL AND assessed_at IS NULL;
