-- A quarantine expires (the control plane's quarantine TTL; NULL: never),
-- after which its pair is routable on trial until its next transfer either
-- ends the quarantine or renews it.
ALTER TABLE pair_quarantines
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN trial      boolean NOT NULL DEFAULT false;
CREATE INDEX pair_quarantines_expiry_idx ON pair_quarantines (expires_at) WHERE NOT trial;
