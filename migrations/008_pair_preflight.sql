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

-- Each peer's probe region, as its agent publishes it for preflights
-- (addresses stored bit for bit in bigint, as kv_data_ptrs are).
CREATE TABLE peer_probes (
    peer_id          uuid PRIMARY KEY REFERENCES peers (id) ON DELETE CASCADE,
    agent_name       text NOT NULL,
    backend          text NOT NULL,
    mem_kind         smallint NOT NULL,
    metadata         bytea NOT NULL,
    addr             bigint NOT NULL,
    len              bigint NOT NULL,
    dev_id           bigint NOT NULL,
    transfer_secret  bytea,
    generation       bigint NOT NULL,
    updated_at       timestamptz NOT NULL
);
