package registry

import (
	"context"
	"errors"
	"time"
)

// Error classes that stores return and the HTTP edge maps to status codes.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
	ErrInvalid  = errors.New("invalid")
	// ErrUnavailable: the store could not be reached (connection refused,
	// the database shutting down or restarting, a broken connection). The
	// request changed nothing that the caller can rely on and may be
	// retried, here or on another replica; the HTTP edge answers 503.
	ErrUnavailable = errors.New("registry store unavailable")
)

// Lease timing handed to agents at registration. A stale peer learns it must
// re-register from its next heartbeat answer, so the interval bounds how
// long a broken decode stays out of routing; at 1 s, 10,000 peers cost the
// PostgreSQL store 10,000 batched rows a second, a fifth of what it writes.
const (
	DefaultHeartbeatInterval = 1 * time.Second
	DefaultLeaseTTL          = 10 * time.Second
)

// Action is what a heartbeat answer tells the agent to do.
type Action string

// Heartbeat actions.
const (
	ActionNone       Action = "none"
	ActionReregister Action = "reregister"
	// ActionHeal tells the agent, once per heal plan, to run its heal
	// action (restart the engine).
	ActionHeal Action = "heal"
)

// Heartbeat is one agent's periodic report.
type Heartbeat struct {
	PeerID     string
	InstanceID string
	Load       Load
	// EngineDown is the agent's verdict from probing its engine: the probes
	// failed often enough in a row to call the engine down. False when the
	// engine is healthy or the agent does not probe it.
	EngineDown bool
	// EngineError is the last failed probe's error, when EngineDown.
	EngineError string
	// HealError is set when the heal action the agent ran failed: its
	// error and the tail of its output.
	HealError string
}

// HeartbeatReply is the control plane's answer to a heartbeat.
type HeartbeatReply struct {
	Action Action `json:"action"`
	Reason string `json:"reason,omitempty"`
	State  State  `json:"state"`
}

// Filter narrows a peer listing; empty fields match everything.
type Filter struct {
	Role  Role
	State State
	Model string
}

// Match reports whether p passes the filter. A filter on role prefill also
// matches peers of role both, and likewise for decode.
func (f Filter) Match(p *Peer) bool {
	switch f.Role {
	case "":
	case RolePrefill:
		if !p.Role.Prefills() {
			return false
		}
	case RoleDecode:
		if !p.Role.Decodes() {
			return false
		}
	default:
		if p.Role != f.Role {
			return false
		}
	}
	return (f.State == "" || p.State == f.State) && (f.Model == "" || p.Model == f.Model)
}

// EventQuery pages through the event log. With After set it returns the
// events after that ID, oldest first (for followers of the live stream);
// otherwise the newest first, before the Before cursor when it is set.
type EventQuery struct {
	Before int64
	After  int64
	Limit  int
	PeerID string
}

// RegisterResult is what a registration did.
type RegisterResult struct {
	Peer    Peer
	Created bool // a new peer, not an update of one with the same name
	// Credential is the credential issued by this registration, to be
	// handed to the agent once; empty when the agent kept its own.
	Credential string
}

// Change tells a watcher that peers changed. A Change with neither PeerIDs
// nor Stale means anything may have changed and the watcher should reload
// everything.
type Change struct {
	PeerIDs []string
	// Stale names peers marked stale, a hint a store may give before it
	// announces their change in PeerIDs (which it always does too): a
	// Mirror takes them out of its routes at once, before it reads them
	// back (a round trip to the database that waits behind everything else
	// on a busy machine).
	Stale []StaleHint
}

// StaleHint is a peer marked stale in its Generation. A mirror whose record
// of the peer is of a later generation (it registered again since) ignores
// it.
type StaleHint struct {
	ID         string
	Generation int64
}

// ReloadAll reports whether c asks for a reload of everything.
func (c Change) ReloadAll() bool { return len(c.PeerIDs) == 0 && len(c.Stale) == 0 }

// Refresher is a Store that reads what a Mirror needs after a change (the
// changed peers, every quarantine and every preflight) in one go: a
// database answers it in one round trip instead of one a read. ids may
// name peers that no longer exist; they are not in the answer.
type Refresher interface {
	Refresh(ctx context.Context, ids []string) ([]Peer, []Quarantine, []Preflight, error)
}

// Quarantine is a (prefill, decode) pair kept out of routing because it
// failed the same way again right after the decode re-registered. See
// quarantine.go for how it ends.
type Quarantine struct {
	PrefillID string    `json:"prefill_id"`
	DecodeID  string    `json:"decode_id"`
	Detail    string    `json:"detail"`
	At        time.Time `json:"at"`
	// ExpiresAt is when the pair goes on trial; nil: never.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Trial: the quarantine expired and the pair is routable again until
	// its next transfer decides.
	Trial bool `json:"trial,omitempty"`
}

// TransferFailure reports that a KV transfer from a prefill to a decode
// failed in a way that says the decode's registration is broken (SGLang's
// "Missing NIXL destination KV memory kind").
type TransferFailure struct {
	DecodeID string
	// DecodeAgent is the NIXL agent name the failed transfer targeted. When
	// the decode no longer has an agent of that name, it has re-registered
	// since and the report is outdated. Empty means "its current agent".
	DecodeAgent string
	// PrefillID is the prefill that could not send; empty when unknown,
	// which rules out quarantine.
	PrefillID string
	Reason    string
	Error     string
	// Reporter names who reported (a peer's name, "admin",
	// "router:<replica>"); it goes into the stale event.
	Reporter string
}

// TransferOutcome says what a TransferFailure did.
type TransferOutcome string

// Transfer failure outcomes.
const (
	// OutcomeStale: the decode is now stale and will be told to re-register.
	OutcomeStale TransferOutcome = "stale"
	// OutcomeAlreadyStale: another report got there first; nothing changed.
	OutcomeAlreadyStale TransferOutcome = "already_stale"
	// OutcomeOutdated: the decode re-registered since the failed transfer.
	OutcomeOutdated TransferOutcome = "outdated"
	// OutcomeQuarantined: the pair failed again right after the decode
	// re-registered, so the pair (not the decode) is taken out of routing.
	OutcomeQuarantined TransferOutcome = "quarantined"
	// OutcomeHealPending: the pair is quarantined and the decode's heal
	// plan holds (registry/heal.go): the decode stays ready for the other
	// prefills and drains when the hold is over. A repeat report of a pair
	// in the plan answers the same and changes nothing.
	OutcomeHealPending TransferOutcome = "heal_pending"
)

// DefaultQuarantineWindow is how recent a pair's previous failure must be
// for a repeat after re-registration to quarantine the pair.
const DefaultQuarantineWindow = 10 * time.Minute

// PairFailure is the last transfer failure recorded for a pair.
type PairFailure struct {
	PrefillID        string
	DecodeID         string
	DecodeGeneration int64
	At               time.Time
}

// Store keeps peers and their events. Every replica of the control plane sees
// the same store; changes made through one are announced to all through
// Subscribe.
//
// Every store refuses input that breaks the field limits in validate.go
// with the *FieldError of the registry's validators, before it changes
// anything, so that all stores accept and refuse exactly the same input.
// An ID that is not a peer ID (IsPeerID) names no peer: ErrNotFound.
type Store interface {
	// Register inserts or updates the peer with spec.Name if claim may
	// (AuthorizeRegistration, decided under the store's lock; ErrForbidden
	// otherwise). The spec must already be validated. A changed instance ID
	// or agent name starts a new generation.
	Register(ctx context.Context, spec PeerSpec, claim Claim) (RegisterResult, error)
	Get(ctx context.Context, id string) (Peer, error)
	List(ctx context.Context, f Filter) ([]Peer, error)
	Delete(ctx context.Context, id string) error
	Drain(ctx context.Context, id string) (Peer, error)
	// Heartbeat extends the peer's lease, records its load, turns a pending
	// or failed peer ready, and tells a stale or restarted one to re-register.
	Heartbeat(ctx context.Context, hb Heartbeat) (HeartbeatReply, error)
	// MarkStale takes the peer out of routing until it re-registers.
	MarkStale(ctx context.Context, id, reason, errText string) (Peer, error)
	// ReportTransferFailure applies ApplyPairTransferFailure atomically:
	// it starts (or joins) the decode's heal plan with the pair
	// quarantined, marks the decode stale, quarantines the pair, or does
	// nothing when the report is a duplicate or outdated.
	ReportTransferFailure(ctx context.Context, f TransferFailure) (Peer, TransferOutcome, error)
	// Quarantines lists the pairs kept out of routing. ReportTransferFailure
	// creates them; either peer re-registering with a different geometry,
	// or being removed, clears them.
	Quarantines(ctx context.Context) ([]Quarantine, error)
	QuarantineControl
	PreflightStore
	ExchangeStore
	// ExpireLeases marks every ready or pending peer whose lease ended before
	// now as failed and returns how many it marked.
	ExpireLeases(ctx context.Context, now time.Time) (int, error)
	// GrantLeaseGrace extends the lease of every pending, ready or stale
	// peer to at least now plus the lease TTL, and returns how many it
	// extended. The lease sweeper calls it when heartbeats may have been
	// lost through no fault of the peers (see LeaseSweeper).
	GrantLeaseGrace(ctx context.Context, now time.Time) (int, error)
	Events(ctx context.Context, q EventQuery) ([]Event, error)
	// Loads returns the load of every peer that has heartbeated, as its
	// last heartbeat reported it. Heartbeats change loads without
	// announcing a change, so a Mirror reads them on a timer.
	Loads(ctx context.Context) ([]PeerLoad, error)
	// Subscribe delivers a Change after every committed change, from any
	// replica, until ctx ends. Slow receivers see coalesced changes.
	Subscribe(ctx context.Context) <-chan Change
	Ping(ctx context.Context) error
	Close()
}
