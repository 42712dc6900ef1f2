-- The last preflight of each (prefill, decode) pair: the prefill's agent
-- wrote a pattern into the decode agent's probe region and read it back.
-- A failed one of the peers' current generations keeps the pair out of
-- routing; the generations say which registrations it was of.
CREATE TABLE pair_preflights (
    prefill_id          uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    decode_id           uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    state               text NOT NULL CHECK (state IN ('passed', 'failed')),
    backend             text NOT NULL,
    mem_kind            smallint NOT NULL,
    gbps                double precision NOT NULL,
    latency_us          double precision NOT NULL,
    checked_at          timestamptz NOT NULL,
    error               text NOT NULL DEFAULT '',
    prefill_generation  bigint NOT NULL,
    decode_generation   bigint NOT NULL,
    PRIMARY KEY (prefill_id, decode_id)
);
CREATE INDEX pair_preflights_decode_idx ON pair_preflights (decode_id);
