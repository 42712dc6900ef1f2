-- A stale peer's heal plan (registry/heal.go): its phase, deadlines and
-- the starts of its recent heals, as the Go rule computed them. One JSON
-- document: only stale peers have a plan, and nothing queries inside it
-- but the sweep of plans whose verification ran out.
ALTER TABLE peers ADD COLUMN heal jsonb NOT NULL DEFAULT '{}';
CREATE INDEX peers_healing_idx ON peers (id) WHERE state = 'stale';
