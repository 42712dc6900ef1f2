package router

import (
	"context"
	"errors"
	"testing"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
)

// TestReportTriesOnceMoreWhenTheStoreDidNotAnswer: a report the store
// could not answer (unavailable, or past the timeout) is made once more; a
// refusal is not, and nothing is made a third time.
func TestReportTriesOnceMoreWhenTheStoreDidNotAnswer(t *testing.T) {
	rt, _ := newPickRouter(t, Config{}, nil)
	rt.reporter = memstore.New(memstore.Config{}) // report runs only with a reporter
	for _, tc := range []struct {
		name  string
		errs  []error // what each call returns, in order
		calls int
	}{
		{"unavailable, then taken", []error{registry.ErrUnavailable, nil}, 2},
		{"timed out, then taken", []error{context.DeadlineExceeded, nil}, 2},
		{"unavailable twice", []error{registry.ErrUnavailable, registry.ErrUnavailable, nil}, 2},
		{"refused", []error{errors.New("validation: bad report"), nil}, 1},
		{"taken", []error{nil}, 1},
	} {
		calls := 0
		rt.report(func(context.Context) error {
			calls++
			return tc.errs[calls-1]
		}, zerolog.Nop(), trace.SpanContext{}, "report")
		rt.reports.Wait()
		if calls != tc.calls {
			t.Errorf("%s: %d calls, want %d", tc.name, calls, tc.calls)
		}
	}
}
