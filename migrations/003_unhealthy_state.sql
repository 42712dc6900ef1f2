-- A peer whose agent heartbeats but whose engine fails the agent's health
-- probes is 'unhealthy': out of routing, and still subject to its lease.
ALTER TABLE peers DROP CONSTRAINT peers_state_check;
ALTER TABLE peers ADD CONSTRAINT peers_state_check
    CHECK (state IN ('pending', 'ready', 'unhealthy', 'stale', 'draining', 'failed'));

DROP INDEX peers_lease_idx;
CREATE INDEX peers_lease_idx ON peers (lease_expiry) WHERE state IN ('pending', 'ready', 'stale', 'unhealthy');
