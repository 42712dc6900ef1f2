-- The latest time each (prefill, decode) pair served a request: every
-- router replica sends the pairs it served in a batch every few seconds,
-- and a pair keeps the latest time any replica saw. After a peer restarts,
-- they tell which partners it exchanged KV with last.
CREATE TABLE pair_exchanges (
    prefill_id  uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    decode_id   uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL,
    PRIMARY KEY (prefill_id, decode_id)
);
CREATE INDEX pair_exchanges_decode_idx ON pair_exchanges (decode_id);
