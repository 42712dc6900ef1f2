package registry

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrForbidden is a caller who proved who it is but may not do what it
// asked: another peer's credential, or a join token for a name that is held.
var ErrForbidden = errors.New("forbidden")

// credentialPrefix starts every peer credential; the peer's ID follows, so
// that the control plane finds the one hash to compare without a search.
const credentialPrefix = "pdpc."

// credentialBytes is the random part of a credential: 256 bits.
const credentialBytes = 32

// NewCredential returns a fresh credential for the peer with the ID and the
// hash to store. Only the hash is kept; the credential itself is handed to
// the registering agent once.
func NewCredential(peerID string) (credential string, hash []byte, err error) {
	var b [credentialBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, fmt.Errorf("new credential: %w", err)
	}
	credential = credentialPrefix + peerID + "." + base64.RawURLEncoding.EncodeToString(b[:])
	return credential, HashCredential(credential), nil
}

// HashCredential is the stored form of a credential. The credential holds
// 256 random bits, so one SHA-256 is enough: there is nothing to guess.
func HashCredential(credential string) []byte {
	h := sha256.Sum256([]byte(credential))
	return h[:]
}

// CredentialPeerID returns the peer ID a credential names, or false when
// the string is not shaped like a credential.
func CredentialPeerID(credential string) (string, bool) {
	rest, ok := strings.CutPrefix(credential, credentialPrefix)
	if !ok {
		return "", false
	}
	id, secret, ok := strings.Cut(rest, ".")
	if !ok || id == "" || len(secret) != base64.RawURLEncoding.EncodedLen(credentialBytes) {
		return "", false
	}
	return id, true
}

// CredentialMatches reports, in constant time, whether credential is the
// one whose hash is stored. A peer with no stored hash matches nothing.
func CredentialMatches(stored []byte, credential string) bool {
	if len(stored) == 0 {
		return false
	}
	return subtle.ConstantTimeCompare(stored, HashCredential(credential)) == 1
}

// Claim is who asks to register a name, as the HTTP edge authenticated
// them. The store decides, under its lock, with AuthorizeRegistration.
type Claim struct {
	// Open: the control plane runs without tokens (loopback, --insecure).
	Open bool
	// Admin: the caller presented the admin token.
	Admin bool
	// Join: the caller presented a join token.
	Join bool
	// Credential is the bearer the caller presented when it was neither
	// token; it may be the credential of the name being registered.
	Credential string
}

// AuthorizeRegistration is the rule for who may register a name. prev is
// the peer registered under the name (nil for a new name). It returns
// whether a fresh credential must be issued (and the old one, if any,
// revoked).
//
//   - A new name: a join token, the admin token, or an open control plane.
//   - A held name: its own credential (kept), or the admin token (a fresh
//     one is issued).
//   - A name whose holder is gone — its lease ran out (state failed, or the
//     lease is past even if the sweeper has not run yet), or it never had a
//     credential (registered while the control plane was open) — may be
//     claimed with a join token, and gets a fresh credential. This is how an
//     agent that lost its credential comes back: it waits out the lease.
//   - A credential is bound to what its peer was when it joined: its role
//     and its model. Re-registering as another role or model widens what
//     the credential may read and report (the other half of another PD
//     split), so it needs the admin token or a new joining: a join token
//     once the name is free.
//   - On an open control plane anything goes, and a fresh credential is
//     issued unless the caller presented the current one.
func AuthorizeRegistration(prev *Peer, next *PeerSpec, c Claim, now time.Time) (issue bool, err error) {
	if prev == nil {
		if c.Open || c.Admin || c.Join {
			return true, nil
		}
		return false, fmt.Errorf("registering a new peer needs a join token: %w", ErrForbidden)
	}
	if c.Credential != "" && CredentialMatches(prev.CredentialHash, c.Credential) {
		if c.Open {
			return false, nil
		}
		switch {
		case next.Role != prev.Role:
			return false, &ForbiddenFieldError{Field: "role", Detail: fmt.Sprintf("peer %s joined as %s: its credential cannot re-register it as %s; "+
				"that needs the admin token, or a join token once the name is free", prev.Name, prev.Role, next.Role)}
		case next.Model != prev.Model:
			return false, &ForbiddenFieldError{Field: "model", Detail: fmt.Sprintf("peer %s joined serving model %q: its credential cannot re-register it for model %q; "+
				"that needs the admin token, or a join token once the name is free", prev.Name, prev.Model, next.Model)}
		}
		return false, nil
	}
	if c.Open || c.Admin {
		return true, nil
	}
	if c.Join && (!prev.Live(now) || len(prev.CredentialHash) == 0) {
		return true, nil
	}
	return false, fmt.Errorf("peer %s is held by another agent: re-registering it needs its credential or the admin token "+
		"(a join token may claim it once its lease expires, at %s): %w", prev.Name, prev.LeaseExpiry.Format(time.RFC3339), ErrForbidden)
}

// ForbiddenFieldError is a caller who may not set a field to what it asked
// (a credential re-registering its peer as another role). It is an
// ErrForbidden that names the field.
type ForbiddenFieldError struct {
	Field  string
	Detail string
}

func (e *ForbiddenFieldError) Error() string { return e.Field + ": " + e.Detail }

// Is makes every *ForbiddenFieldError match ErrForbidden.
func (e *ForbiddenFieldError) Is(target error) bool { return target == ErrForbidden }

// AgentNameTakenError is a registration naming a NIXL agent that another
// live peer registered. A prefill's transfer agent finds a decode by its
// agent name (SGLang's bootstrap names a decode by its agent only), so a
// second holder would take the first one's transfers.
type AgentNameTakenError struct {
	Field  string // the rank's field, ranks[i].agent_name
	Agent  string
	Holder string // the name of the peer that holds it
}

func (e *AgentNameTakenError) Error() string {
	return fmt.Sprintf("%s: NIXL agent %q is registered by live peer %s; agent names are unique across live peers", e.Field, e.Agent, e.Holder)
}

// Is makes every *AgentNameTakenError match ErrConflict.
func (e *AgentNameTakenError) Is(target error) bool { return target == ErrConflict }

// CheckAgentNames is the rule that NIXL agent names are unique across live
// peers: a registration may not name an agent that a live peer of another
// name registered. holder returns the name of such a peer for agent, if
// any, leaving out the peer named spec.Name (its re-registration may keep
// its agents); the store answers it under the lock it registers under.
func CheckAgentNames(spec *PeerSpec, holder func(agent string) (peer string, ok bool)) error {
	for i, r := range spec.Ranks {
		if name, ok := holder(r.AgentName); ok {
			return &AgentNameTakenError{Field: fmt.Sprintf("ranks[%d].agent_name", i), Agent: r.AgentName, Holder: name}
		}
	}
	return nil
}
