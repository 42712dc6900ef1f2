package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

// maxPayload keeps NOTIFY payloads under PostgreSQL's 8000-byte limit; a
// change naming more peers than fit is sent as "*" (reload everything).
const maxPayload = 7900

func encodeIDs(ids []string) string {
	n := 0
	for _, id := range ids {
		n += len(id) + 1
	}
	if len(ids) == 0 || n > maxPayload {
		return "*"
	}
	return strings.Join(ids, ",")
}

// encodeStaleHint and decodeStaleHint are a stale hint's payload:
// "ID GENERATION".
func encodeStaleHint(id string, generation int64) string {
	return id + " " + strconv.FormatInt(generation, 10)
}

func decodeStaleHint(payload string) (registry.StaleHint, bool) {
	id, gen, ok := strings.Cut(payload, " ")
	g, err := strconv.ParseInt(gen, 10, 64)
	if !ok || err != nil || !registry.IsPeerID(id) {
		return registry.StaleHint{}, false
	}
	return registry.StaleHint{ID: id, Generation: g}, true
}

func decodeIDs(payload string) registry.Change {
	if payload == "*" || payload == "" {
		return registry.Change{}
	}
	return registry.Change{PeerIDs: strings.Split(payload, ",")}
}

// listen holds the process's one LISTEN connection and republishes every
// notification to local subscribers. It reconnects with backoff; after a
// reconnect it announces a full reload, since notifications sent while it
// was away are lost. The first connection's outcome is sent on ready.
func (s *Store) listen(ctx context.Context, cc *pgx.ConnConfig, ready chan<- error) {
	backoff := 100 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err == nil {
			// Both in one simple-protocol query (pgx sends a query
			// without arguments that way): the channel and its hints.
			_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.cfg.Channel}.Sanitize()+"; LISTEN "+pgx.Identifier{s.cfg.staleChannel()}.Sanitize())
		}
		if first {
			first = false
			ready <- err
			if err != nil {
				if conn != nil {
					conn.Close(context.Background())
				}
				return
			}
		} else if err == nil {
			s.bc.Publish(registry.Change{})
		}
		if err == nil {
			backoff = 100 * time.Millisecond
			err = s.follow(ctx, conn)
			conn.Close(context.Background())
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("registry notification listener lost its connection")
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (s *Store) follow(ctx context.Context, conn *pgx.Conn) error {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		if n.Channel == s.cfg.staleChannel() {
			if h, ok := decodeStaleHint(n.Payload); ok {
				s.bc.Publish(registry.Change{Stale: []registry.StaleHint{h}})
			}
			continue
		}
		s.bc.Publish(decodeIDs(n.Payload))
	}
}
