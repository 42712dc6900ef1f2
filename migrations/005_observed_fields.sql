-- Where a peer's fields came from: those read from the engine (observed) and
-- those nobody could tell (unknown); every other field was declared. A peer
-- registered from what a stock engine publishes has no ranks, so "ranks"
-- is then in unknown.
ALTER TABLE peers
    ADD COLUMN observed text[] NOT NULL DEFAULT '{}',
    ADD COLUMN unknown  text[] NOT NULL DEFAULT '{}';
