-- depends: 0007.assessment-shed
-- Catch-up assessment (issue #29): the gateway looks for steps shed under load whose answer
-- is still archived and that nobody has assessed since, every few seconds while its ASR is
-- idle. A partial index keeps that lookup to those rows however long the learning record
-- grows: a step leaves it when it is assessed or its audio goes (retention clears audio_id).
-- One script for SQLite (3.8+) and PostgreSQL.
CREATE INDEX steps_shed_unassessed ON steps (instance_id)
    WHERE assessment_shed IS NOT NULL AND assessed_at IS NULL AND audio_id IS NOT NULL;
