-- depends: 0001.instances-and-steps
-- Behaviour signals of a step (issue #27, spec §18-19): numbers, never a diagnosis.
-- response_latency_ms: listen window open -> the child's speech start (NULL: nothing said);
-- step_completed: 1 when the step ran to its end with a transcript, 0 when cut short.
ALTER TABLE steps ADD COLUMN response_latency_ms BIGINT;
ALTER TABLE steps ADD COLUMN step_completed INTEGER;
