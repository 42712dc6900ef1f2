package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// keepAlive is how often an idle event stream sends a comment, so proxies
// and browsers keep the connection open.
const keepAlive = 15 * time.Second

// StreamEvents follows the event log as server-sent events. The generated
// response type flushes every write; the stream ends when the client leaves
// or, with a last comment, when the server shuts down (BeginShutdown).
func (h handlers) StreamEvents(ctx context.Context, req api.StreamEventsRequestObject) (api.StreamEventsResponseObject, error) {
	after := apiconv.Deref(req.Params.After)
	if after < 0 {
		return nil, malformed("after", "after must not be negative")
	}
	if id := req.Params.LastEventID; id != nil {
		if *id < 0 {
			return nil, malformed("Last-Event-ID", "Last-Event-ID must be an event id, not negative")
		}
		after = *id
	}
	// Subscribe before reading the cursor so that nothing committed in
	// between is missed.
	reqCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	changes := h.store.Subscribe(ctx)
	if after == 0 && req.Params.After == nil {
		newest, err := h.store.Events(ctx, registry.EventQuery{Limit: 1})
		if err != nil {
			cancel()
			return nil, fmt.Errorf("read event cursor: %w", err)
		}
		if len(newest) > 0 {
			after = newest[0].ID
		}
	}
	pr, pw := io.Pipe()
	finished := make(chan struct{})
	go func() {
		defer cancel()
		pw.CloseWithError(h.followEvents(ctx, pw, changes, after))
		close(finished)
	}()
	go func() {
		// Only when the client leaves: after a stream that ended by itself
		// (a shutdown) the writer must still read the rest and the EOF,
		// not a closed pipe, which it would answer with a 500 appended to
		// the stream.
		select {
		case <-reqCtx.Done():
			pr.CloseWithError(reqCtx.Err()) // unblocks the response writer
		case <-finished:
		}
	}()
	return api.StreamEvents200TexteventStreamResponse{Body: pr}, nil
}

func (h handlers) followEvents(ctx context.Context, w io.Writer, changes <-chan registry.Change, after int64) error {
	if _, err := io.WriteString(w, ": pdplane event stream\nretry: 1000\n\n"); err != nil {
		return err
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	send := func() error {
		for {
			evs, err := h.store.Events(ctx, registry.EventQuery{After: after, Limit: 500})
			if err != nil {
				return err
			}
			for i := range evs {
				data, err := json.Marshal(apiconv.Event(&evs[i]))
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintf(w, "id: %d\nevent: peer-event\ndata: %s\n\n", evs[i].ID, data); err != nil {
					return err
				}
				after = evs[i].ID
			}
			if len(evs) < 500 {
				return nil
			}
		}
	}
	if err := send(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.shuttingDown:
			return writeShutdownComment(w)
		case _, ok := <-changes:
			if !ok {
				return ctx.Err()
			}
			if err := send(); err != nil {
				return err
			}
		case <-tick.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return err
			}
		}
	}
}
