package transfer_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/transfer"
)

func TestPreflightLadder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		min, max int
		want     []int
	}{
		{0, 0, []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}},
		{4 << 10, 100 << 10, []int{4 << 10, 16 << 10, 64 << 10, 100 << 10}},
		{4 << 10, 4 << 10, []int{4 << 10}},
		{8 << 10, 1 << 10, []int{8 << 10}},
	} {
		got := transfer.PreflightConfig{MinSize: tc.min, MaxSize: tc.max}.Ladder()
		if !slices.Equal(got, tc.want) {
			t.Errorf("ladder %d..%d = %v, want %v", tc.min, tc.max, got, tc.want)
		}
	}
}

func TestCheckPatternNamesTheByte(t *testing.T) {
	t.Parallel()
	for _, at := range []int{0, 50, 97} { // first word, mid-word, the unaligned tail
		b := make([]byte, 100)
		transfer.FillPattern(b, 7)
		if err := transfer.CheckPattern(b, 7); err != nil {
			t.Fatal(err)
		}
		b[at] ^= 1
		err := transfer.CheckPattern(b, 7)
		if !errors.Is(err, transfer.ErrPatternMismatch) || !strings.HasPrefix(err.Error(), fmt.Sprintf("byte %d of 100 ", at)) {
			t.Fatalf("CheckPattern = %v, want the mismatch at byte %d", err, at)
		}
	}
}
