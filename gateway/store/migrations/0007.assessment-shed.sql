-- depends: 0001.instances-and-steps
-- Assessment shedding (issue #29): a step whose utterance the bounded ASR queue shed (the
-- oldest queued job goes when the queue is full) keeps the reason here, so no answer is lost
-- without a trace. NULL: never shed. One script for SQLite and PostgreSQL.
ALTER TABLE steps ADD COLUMN assessment_shed TEXT;
