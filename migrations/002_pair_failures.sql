-- The last transfer failure of each (prefill, decode) pair, so that a repeat
-- right after the decode re-registered quarantines the pair instead of
-- marking the decode stale again, whichever replica or reporter sees it.
CREATE TABLE pair_failures (
    prefill_id         uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    decode_id          uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    decode_generation  bigint NOT NULL,
    at                 timestamptz NOT NULL,
    PRIMARY KEY (prefill_id, decode_id)
);
CREATE INDEX pair_failures_decode_idx ON pair_failures (decode_id);
