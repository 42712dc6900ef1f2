-- Peers: one row per engine instance. Re-registration keeps the row (and its
-- id) and bumps generation when the instance or a NIXL agent name changes.
CREATE TABLE peers (
    id              uuid PRIMARY KEY,
    name            text NOT NULL UNIQUE,
    role            text NOT NULL CHECK (role IN ('prefill', 'decode', 'both')),
    engine          text NOT NULL CHECK (engine IN ('sglang', 'vllm', 'sim')),
    url             text NOT NULL,
    bootstrap_host  text NOT NULL DEFAULT '',
    bootstrap_port  integer NOT NULL DEFAULT 0,
    model           text NOT NULL,
    instance_id     text NOT NULL,
    transfer_group  text NOT NULL DEFAULT '',
    labels          jsonb NOT NULL DEFAULT '{}',

    tp_size         integer NOT NULL,
    attn_tp_size    integer NOT NULL,
    dp_size         integer NOT NULL,
    pp_size         integer NOT NULL,
    pp_rank         integer NOT NULL,
    dcp_size        integer NOT NULL,
    dcp_rank        integer NOT NULL,

    page_size       integer NOT NULL,
    kv_dtype        text NOT NULL,
    num_layers      integer NOT NULL,
    num_kv_heads    integer NOT NULL,
    head_dim        integer NOT NULL,
    is_mla          boolean NOT NULL,

    state           text NOT NULL CHECK (state IN ('pending', 'ready', 'stale', 'draining', 'failed')),
    state_reason    text NOT NULL DEFAULT '',
    generation      bigint NOT NULL,
    lease_expiry    timestamptz NOT NULL,
    last_heartbeat  timestamptz,
    load_running    integer NOT NULL DEFAULT 0,
    load_queued     integer NOT NULL DEFAULT 0,
    load_kv_usage   double precision NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL
);

-- The lease sweeper looks for live peers whose lease ran out.
CREATE INDEX peers_lease_idx ON peers (lease_expiry) WHERE state IN ('pending', 'ready', 'stale');

-- Ranks: one row per device of a peer, with its NIXL agent and KV regions.
-- Pointers and lengths are uint64 stored bit-for-bit in bigint.
CREATE TABLE peer_ranks (
    peer_id         uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    rank            integer NOT NULL,
    gpu_id          integer NOT NULL,
    agent_name      text NOT NULL,
    agent_metadata  bytea NOT NULL DEFAULT '',
    kv_data_ptrs    bigint[] NOT NULL,
    kv_data_lens    bigint[] NOT NULL,
    kv_item_lens    bigint[] NOT NULL,
    kv_mem_kinds    smallint[] NOT NULL,
    aux_data_ptrs   bigint[] NOT NULL DEFAULT '{}',
    aux_data_lens   bigint[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (peer_id, rank),
    CHECK (cardinality(kv_mem_kinds) = cardinality(kv_data_ptrs))
);

-- Events: append-only; kept after a peer is removed, so no foreign key.
CREATE TABLE peer_events (
    id          bigserial PRIMARY KEY,
    peer_id     uuid NOT NULL,
    peer_name   text NOT NULL,
    kind        text NOT NULL,
    generation  bigint NOT NULL,
    message     text NOT NULL DEFAULT '',
    error       text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL
);
CREATE INDEX peer_events_peer_idx ON peer_events (peer_id, id);

-- Pairs kept out of routing because they fail deterministically.
CREATE TABLE pair_quarantines (
    prefill_id  uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    decode_id   uuid NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    detail      text NOT NULL,
    at          timestamptz NOT NULL,
    PRIMARY KEY (prefill_id, decode_id)
);
CREATE INDEX pair_quarantines_decode_idx ON pair_quarantines (decode_id);
