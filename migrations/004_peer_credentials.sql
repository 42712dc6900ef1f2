-- Each peer's agent holds a credential issued at registration; only its
-- SHA-256 is kept. Heartbeats, stale reports and re-registrations of the
-- peer need it. Empty for peers registered while the control plane ran
-- without tokens: a join token may claim those names.
ALTER TABLE peers ADD COLUMN credential_hash bytea NOT NULL DEFAULT '';

-- The secret of each rank's transfer agent (TCP backend), chosen by the
-- agent for that agent name (so for that generation) and handed only to
-- authenticated peers: published metadata alone does not open a connection.
ALTER TABLE peer_ranks ADD COLUMN transfer_secret bytea NOT NULL DEFAULT '';
