-- A registration looks up who holds each of its NIXL agent names (agent
-- names are unique across live peers, registry.CheckAgentNames).
CREATE INDEX peer_ranks_agent_name_idx ON peer_ranks (agent_name);
