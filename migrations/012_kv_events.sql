-- Where a peer's engine publishes its KV cache events (ZMQ PUB and replay
-- endpoints, and the topic); empty when it publishes none. Router replicas
-- subscribe there to route by the prefixes each engine holds.
ALTER TABLE peers
    ADD COLUMN kv_events_endpoint        text NOT NULL DEFAULT '',
    ADD COLUMN kv_events_replay_endpoint text NOT NULL DEFAULT '',
    ADD COLUMN kv_events_topic           text NOT NULL DEFAULT '';
