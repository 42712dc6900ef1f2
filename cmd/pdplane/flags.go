package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// flagSet wraps flag.FlagSet so that every flag takes its default from a
// PDPLANE_* environment variable and says so in its help.
type flagSet struct {
	*flag.FlagSet
	errs []error
}

func newFlagSet(name string) *flagSet {
	return &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError)}
}

func envName(flagName string) string {
	return "PDPLANE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (f *flagSet) str(p *string, name, def, help string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		def = v
	}
	f.StringVar(p, name, def, help+" ($"+envName(name)+")")
}

func (f *flagSet) dur(p *time.Duration, name string, def time.Duration, help string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("$%s: %w", envName(name), err))
		} else {
			def = d
		}
	}
	f.DurationVar(p, name, def, help+" ($"+envName(name)+")")
}

func (f *flagSet) int(p *int, name string, def int, help string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("$%s: %w", envName(name), err))
		} else {
			def = n
		}
	}
	f.IntVar(p, name, def, help+" ($"+envName(name)+")")
}

func (f *flagSet) parse(args []string) error {
	if err := f.Parse(args); err != nil {
		return err
	}
	if len(f.errs) > 0 {
		return f.errs[0]
	}
	if f.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", f.Args())
	}
	return nil
}
