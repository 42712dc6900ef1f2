package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/server/api"
)

const eventsAbout = `The event log: state changes, stale reports, heals, quarantines. The table
lists the page oldest first; -o json|yaml prints the API's EventList (newest
first). --follow then prints new events as they happen (GET
/api/v1/events/stream; in json, one Event per line; in yaml, one document
each) until interrupted, reconnecting where it left off.`

// runEvents is the CLI over GET /api/v1/events and its stream.
func runEvents(ctx context.Context, args []string) error {
	return eventsCmd(ctx, args, os.Stdout)
}

func eventsCmd(ctx context.Context, args []string, out io.Writer) error {
	var peer string
	var limit int
	var follow bool
	if len(args) > 0 && (args[0] == "help") {
		args = []string{"-h"}
	}
	fs := cli.NewFlagSet("events")
	fs.Stdout = out
	fs.Synopsis = "pdplane events [--peer PEER] [--limit N] [--follow] [-o table|json|yaml] [flags]"
	fs.About = eventsAbout
	var cf clientFlags
	cf.register(fs, false, true)
	fs.Str(&peer, "peer", "", "only this peer's events (its name or id)")
	fs.Int(&limit, "limit", 50, "the newest this many events (1 to 1000)")
	fs.Bool(&follow, "follow", false, "then print new events as they happen, until interrupted")
	fs.Shorthand("f", "follow")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if limit < 1 || limit > 1000 {
		return cli.Usagef("invalid value %d for --limit: want an integer from 1 to 1000", limit)
	}
	c, err := cf.client(out)
	if err != nil {
		return err
	}
	params := &api.ListEventsParams{Limit: &limit}
	var peerID string
	if peer != "" {
		p, err := c.resolvePeer(ctx, peer)
		if err != nil {
			return err
		}
		peerID = p.Id
		params.PeerId = &peerID
	}
	resp, err := c.ListEventsWithResponse(ctx, params)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return answerError(resp.StatusCode(), resp.Body)
	}
	evs := slices.Clone(resp.JSON200.Events)
	slices.Reverse(evs) // oldest first
	var last int64
	for _, e := range evs {
		last = max(last, e.Id)
	}
	if !follow {
		return c.print(resp.Body, func(w io.Writer) error {
			eventHeader(w)
			for _, e := range evs {
				eventRow(w, e)
			}
			return nil
		})
	}
	// Following: the page first, then the stream, in one form.
	if c.output == "table" {
		w := newEventWriter(out)
		eventHeader(w)
		for _, e := range evs {
			eventRow(w, e)
		}
		w.Flush()
	} else {
		for _, e := range evs {
			if err := c.printEvent(e); err != nil {
				return err
			}
		}
	}
	if peer != "" && len(evs) == 0 {
		// The stream has no peer filter; start where the log is now.
		all, err := c.ListEventsWithResponse(ctx, &api.ListEventsParams{Limit: ptr(1)})
		if err == nil && all.JSON200 != nil && len(all.JSON200.Events) > 0 {
			last = all.JSON200.Events[0].Id
		}
	}
	return c.follow(ctx, last, func(e api.Event) error {
		if peerID != "" && e.PeerId != peerID {
			return nil
		}
		if c.output == "table" {
			w := newEventWriter(out)
			eventRow(w, e)
			return w.Flush()
		}
		return c.printEvent(e)
	})
}

func ptr[T any](v T) *T { return &v }

// Rows printed one at a time must line up with the header: fixed widths.
func newEventWriter(out io.Writer) *fixedWriter { return &fixedWriter{out: out} }

type fixedWriter struct {
	out  io.Writer
	rows [][]string
}

func (w *fixedWriter) Write(p []byte) (int, error) {
	w.rows = append(w.rows, strings.Split(strings.TrimSuffix(string(p), "\n"), "\t"))
	return len(p), nil
}

func (w *fixedWriter) Flush() error {
	widths := []int{19, 8, 18, 20, 4}
	for _, r := range w.rows {
		var b strings.Builder
		for i, cell := range r {
			if i < len(widths) && i < len(r)-1 {
				fmt.Fprintf(&b, "%-*s  ", widths[i], cell)
			} else {
				b.WriteString(cell)
			}
		}
		if _, err := fmt.Fprintln(w.out, strings.TrimRight(b.String(), " ")); err != nil {
			return err
		}
	}
	w.rows = nil
	return nil
}

func eventHeader(w io.Writer) {
	fmt.Fprintln(w, "AT\tID\tKIND\tPEER\tGEN\tMESSAGE")
}

func eventRow(w io.Writer, e api.Event) {
	msg := orDash(e.Message)
	if e.Error != nil && *e.Error != "" {
		msg += ": " + *e.Error
	}
	fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%d\t%s\n", e.At.Local().Format(time.DateTime), e.Id, e.Kind, e.PeerName, e.Generation, msg)
}

func (c *client) printEvent(e api.Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if c.output == "yaml" {
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.out, "---\n%s", y)
		return err
	}
	_, err = fmt.Fprintf(c.out, "%s\n", b)
	return err
}

// follow reads the event stream from after on, calling each for every
// event, until ctx ends; a broken stream is opened again from the last event
// seen.
func (c *client) follow(ctx context.Context, after int64, each func(api.Event) error) error {
	raw, err := api.NewClient(c.base, api.WithHTTPClient(&http.Client{}), api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
		if c.token != "" {
			r.Header.Set("Authorization", "Bearer "+c.token)
		}
		return nil
	}))
	if err != nil {
		return err
	}
	for {
		err := c.stream(ctx, raw, &after, each)
		if ctx.Err() != nil {
			return nil
		}
		var refused *streamRefused
		if errors.As(err, &refused) && !refused.retry {
			return err
		}
		fmt.Fprintf(os.Stderr, "pdplane: event stream: %v; reconnecting\n", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

type streamRefused struct {
	err   error
	retry bool
}

func (e *streamRefused) Error() string { return e.err.Error() }

func (c *client) stream(ctx context.Context, raw *api.Client, after *int64, each func(api.Event) error) error {
	resp, err := raw.StreamEvents(ctx, &api.StreamEventsParams{After: after})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return &streamRefused{err: answerError(resp.StatusCode, body), retry: resp.StatusCode >= 500}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() == 0 {
				continue
			}
			var e api.Event
			if err := json.Unmarshal([]byte(data.String()), &e); err != nil {
				return fmt.Errorf("an event that is not JSON: %w", err)
			}
			data.Reset()
			if e.Id <= *after {
				continue
			}
			*after = e.Id
			if err := each(e); err != nil {
				return &streamRefused{err: err}
			}
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the control plane closed it")
}
