package main

import (
	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/gcfloor"
)

// defaultGCMinHeapMiB is --gc-min-heap-mib's default.
const defaultGCMinHeapMiB = 64

// gcMinHeapFlag is --gc-min-heap-mib, for the commands that serve load
// alone in their process (serve, sim); start it with startGCFloorMiB after
// parsing.
func gcMinHeapFlag(fs *cli.FlagSet, mib *int) {
	fs.Int(mib, "gc-min-heap-mib", defaultGCMinHeapMiB, "MiB the heap may grow to between garbage collections however little of it is live "+
		"(fewer collections under load; above half of it live, collections are as at GOGC=100); 0, or GOGC set, leaves the Go defaults")
}

// startGCFloorMiB checks --gc-min-heap-mib's value and starts the floor.
func startGCFloorMiB(mib int) (stop func(), err error) {
	if mib < 0 || mib > 1<<20 {
		return nil, cli.Usagef("invalid value %d for --gc-min-heap-mib: want 0 to 1048576 (1 TiB)", mib)
	}
	return gcfloor.Start(uint64(mib) << 20), nil
}
