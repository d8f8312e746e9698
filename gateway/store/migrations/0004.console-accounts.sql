-- depends: 0001.instances-and-steps
-- Console accounts (docs/console.md): people, the devices each may see, and server-side
-- sessions. One script for SQLite and PostgreSQL; times are epoch milliseconds.
CREATE TABLE console_users (
    name TEXT PRIMARY KEY NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('parent', 'teacher', 'operator')),
    password_hash TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);
-- A parent's children (one device each) or a teacher's class; operators see every device.
CREATE TABLE console_grants (
    name TEXT NOT NULL REFERENCES console_users (name) ON DELETE CASCADE,
    device TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (name, device)
);
-- Sessions are stored by the SHA-256 of their token: a read of the table logs nobody in.
CREATE TABLE console_sessions (
    token_hash TEXT PRIMARY KEY NOT NULL,
    name TEXT NOT NULL REFERENCES console_users (name) ON DELETE CASCADE,
    csrf TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL
);
CREATE INDEX console_sessions_name ON console_sessions (name);
