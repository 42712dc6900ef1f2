// Package devfleet runs simulated engines with their agents: the fleet
// behind `pdplane dev` and the engine behind `pdplane sim`, and the set-up
// of the end-to-end tests that exercise both.
//
// It owns the wiring between a sim.Sim and the agent.Agent that registers
// it: the simulator's failed transfers go to the control plane as stale
// reports, the simulator learns its peer ID from each registration, and
// with a control plane it asks it for remote agents' TCP transfer secrets.
// A Fleet starts N prefills and M decodes wired that way against control
// planes given by URL.
//
// It must not import router, server or the stores: the control plane is
// something it talks to over HTTP (through agent and the generated client
// in server/api), never something it builds. Only cmd/pdplane imports it.
package devfleet
