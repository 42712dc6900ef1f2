-- Heartbeats rewrite lease_expiry of every peer every interval (10,000
-- peers every 2 s is 5,000 row updates a second). With lease_expiry in an
-- index no heartbeat could be a heap-only (HOT) update: each one wrote a
-- new entry into every index of the table (primary key, name, lease), five
-- WAL records a row, and the indexes bloated between vacuums. Without it a
-- heartbeat that changes no state leaves the indexes alone. The lease
-- sweep, which one replica runs at a time, reads the table sequentially
-- instead: a few thousand pages at 10,000 peers.
DROP INDEX peers_lease_idx;
-- Room on each page for the next version of its rows, so that the update
-- can stay on the page (HOT needs it).
ALTER TABLE peers SET (fillfactor = 50);
