// Package cli is the flags of pdplane's commands: each flag also reads a
// PDPLANE_* environment variable and, for the commands that take one, a key
// of a YAML config file (--config), the command line winning over the
// variable and the variable over the file; --print-config prints the result.
// A bad value is a UsageError naming the flag and the form it wants.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// FlagSet wraps flag.FlagSet so that every flag also reads a PDPLANE_*
// environment variable (the flag given on the command line wins), says so in
// its help, and names itself and the form it wants when a value is wrong.
type FlagSet struct {
	*flag.FlagSet
	name     string // the command, e.g. "peers show"
	Synopsis string // usage lines after "Usage:", one per line; default "pdplane NAME [flags]"
	About    string // a paragraph after the usage lines

	Stdout, Stderr io.Writer

	bad        error             // the last bad value a Set refused
	deprecated map[string]string // flag name → what replaces it
	Shorthands map[string]string // short name → long name
	SetBy      map[string]string // flag name → "flag", "$PDPLANE_X" or the config file's path, after parse

	// config and printConfig are --config and --print-config, for the
	// commands that take a config file (configFile); nil otherwise.
	Config      *string
	printConfig *bool
	// lookupEnv reads a flag's variable: os.LookupEnv, or a map in tests.
	LookupEnv func(string) (string, bool)
}

func NewFlagSet(name string) *FlagSet {
	f := &FlagSet{
		FlagSet:    flag.NewFlagSet(name, flag.ContinueOnError),
		name:       name,
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		deprecated: map[string]string{},
		Shorthands: map[string]string{},
		SetBy:      map[string]string{},
		LookupEnv:  os.LookupEnv,
	}
	f.SetOutput(io.Discard) // parse reports errors itself, help goes to stdout
	f.Usage = func() {}
	return f
}

// EnvName is the variable a flag reads: PDPLANE_ and its name in capitals,
// dashes as underscores.
func EnvName(flagName string) string {
	return "PDPLANE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// UsageError is a command line pdplane cannot run: exit status 2.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func Usagef(format string, a ...any) error {
	return &UsageError{msg: fmt.Sprintf(format, a...)}
}

// value is a flag value that parses its own form and can say what it wants.
type value[T any] struct {
	p      *T
	f      *FlagSet
	name   string
	kind   string // shown in the help: duration, int, bool, string, or the choices
	want   string // "a duration such as 10s, 1m30s"
	parse  func(string) (T, error)
	format func(T) string
	isBool bool
	list   bool   // a comma-separated list: a config file may give a YAML sequence
	sample string // a valid value other than the default, for tests
}

func (v *value[T]) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return v.format(*v.p)
}

func (v *value[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		v.f.bad = v.invalid(s)
		return v.f.bad
	}
	*v.p = x
	return nil
}

// check is Set without setting: a config file's value that the
// environment or the command line overrides is still checked.
func (v *value[T]) check(s string) error {
	if _, err := v.parse(s); err != nil {
		return v.invalid(s)
	}
	return nil
}

func (v *value[T]) invalid(s string) error {
	return fmt.Errorf("invalid value %q for --%s: want %s", s, v.name, v.want)
}

func (v *value[T]) IsBoolFlag() bool { return v.isBool }

// envFlag is what every flag registered through FlagSet's helpers is.
type envFlag interface {
	flag.Value
	sampleValue() string
	kindName() string
	check(string) error
	isList() bool
}

func (v *value[T]) sampleValue() string { return v.sample }

func (v *value[T]) kindName() string { return v.kind }
func (v *value[T]) isList() bool     { return v.list }

// Sample is a valid value of a flag registered through FlagSet's helpers,
// for tests that set every flag; ok is false for any other flag.
func Sample(v flag.Value) (s string, ok bool) {
	ev, ok := v.(envFlag)
	if !ok {
		return "", false
	}
	return ev.sampleValue(), true
}

// Add registers a flag whose value parses itself; its help names its
// variable.
func (f *FlagSet) Add(v flag.Value, name, help string) {
	f.Var(v, name, help+" ($"+EnvName(name)+")")
}

// Str, Dur, Bool and Int register a flag of that type with its default.
func (f *FlagSet) Str(p *string, name, def, help string) {
	*p = def
	f.Add(&value[string]{p: p, f: f, name: name, kind: "string", want: "a string",
		parse: func(s string) (string, error) { return s, nil }, format: func(s string) string { return s },
		sample: "sample-" + name}, name, help)
}

// List is a string flag that holds a comma-separated list.
func (f *FlagSet) List(p *string, name, def, help string) {
	f.Str(p, name, def, help)
	f.Lookup(name).Value.(*value[string]).list = true
}

func (f *FlagSet) Dur(p *time.Duration, name string, def time.Duration, help string) {
	*p = def
	f.Add(&value[time.Duration]{p: p, f: f, name: name, kind: "duration", want: "a duration such as 10s, 1m30s",
		parse: time.ParseDuration, format: time.Duration.String, sample: "1m37s"}, name, help)
}

func (f *FlagSet) Bool(p *bool, name string, def bool, help string) {
	*p = def
	f.Add(&value[bool]{p: p, f: f, name: name, kind: "bool", want: "true or false", isBool: true,
		parse: strconv.ParseBool, format: strconv.FormatBool, sample: strconv.FormatBool(!def)}, name, help)
}

func (f *FlagSet) Int(p *int, name string, def int, help string) {
	*p = def
	f.Add(&value[int]{p: p, f: f, name: name, kind: "int", want: "an integer such as 8",
		parse: strconv.Atoi, format: strconv.Itoa, sample: "37"}, name, help)
}

// Custom registers a flag of a form of its own: kind is shown in the help,
// want is what a bad value is told, sample is a valid value (for tests).
func Custom[T any](f *FlagSet, p *T, name, kind, want, sample string, parse func(string) (T, error), format func(T) string, help string) {
	f.Add(&value[T]{p: p, f: f, name: name, kind: kind, want: want, parse: parse, format: format, sample: sample}, name, help)
}

// Choice is a string flag that takes one of choices.
func (f *FlagSet) Choice(p *string, name, def string, choices []string, help string) {
	*p = def
	f.Add(&value[string]{p: p, f: f, name: name, kind: strings.Join(choices, "|"),
		want: "one of " + strings.Join(choices, ", "),
		parse: func(s string) (string, error) {
			if s == "" {
				return s, nil // the default: no choice made
			}
			for _, c := range choices {
				if s == c {
					return s, nil
				}
			}
			return "", errors.New("not a choice")
		},
		format: func(s string) string { return s }, sample: choices[len(choices)-1]}, name, help)
}

// Shorthand makes -short another name of the flag long.
func (f *FlagSet) Shorthand(short, long string) {
	f.Shorthands[short] = long
	f.Var(f.Lookup(long).Value, short, "short for --"+long)
}

// DeprecatedStr is a string flag kept for its old users: setting it (or its
// variable) warns and names what replaces it.
func (f *FlagSet) DeprecatedStr(p *string, name, replacement string) {
	f.deprecated[name] = replacement
	f.Str(p, name, "", "deprecated: the same as --"+replacement)
}

// OutputFlag is the -o/--output flag of the commands that print API objects.
func (f *FlagSet) OutputFlag(p *string) {
	f.Choice(p, "output", "table", []string{"table", "json", "yaml"}, "output format: table, or the API objects as json or yaml")
	f.Shorthand("o", "output")
}

// ParseHook, when set (by tests), runs at the end of every successful parse
// and its error is returned in place of nil.
var ParseHook func(*FlagSet) error

// Parse reads the config file (configFile), the flags' variables, then
// args, each overriding the one before; no positional arguments may remain.
func (f *FlagSet) Parse(args []string) error {
	pos, err := f.ParseArgs(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return Usagef("%s: unexpected arguments: %s (see 'pdplane %s -h')", f.name, strings.Join(pos, " "), f.name)
	}
	return nil
}

// ParseArgs is parse for commands with positional arguments, which may come
// before, between or after the flags; it returns them. -h or --help prints
// the usage to stdout and returns flag.ErrHelp; --print-config prints the
// configuration to stdout and returns ErrPrinted.
//
// The variables and args are read first, so that --config may come from
// either; the file then sets only the flags neither of them set.
func (f *FlagSet) ParseArgs(args []string) ([]string, error) {
	envErrs := map[string]error{}
	f.VisitAll(func(fl *flag.Flag) {
		if _, short := f.Shorthands[fl.Name]; short {
			return
		}
		env := EnvName(fl.Name)
		v, ok := f.LookupEnv(env)
		if !ok {
			return
		}
		if v == "" {
			if ev, ok := fl.Value.(envFlag); !ok || ev.kindName() != "string" {
				return // an empty variable leaves a non-string flag at its default
			}
		}
		f.bad = nil
		if err := fl.Value.Set(v); err != nil {
			why := err.Error()
			if f.bad != nil {
				why = f.bad.Error()
			}
			envErrs[fl.Name] = fmt.Errorf("%s=%s: %s", env, v, why)
			return
		}
		f.SetBy[fl.Name] = "$" + env
	})
	var pos []string
	for {
		f.bad = nil
		if err := f.FlagSet.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				f.PrintUsage(f.Stdout)
				return nil, flag.ErrHelp
			}
			if f.bad != nil {
				return nil, &UsageError{msg: f.bad.Error()}
			}
			msg := strings.Replace(err.Error(), "flag provided but not defined: ", "unknown flag ", 1)
			return nil, Usagef("%s: %s (see 'pdplane %s -h')", f.name, msg, f.name)
		}
		args = f.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			pos = append(pos, args[1:]...)
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	f.Visit(func(fl *flag.Flag) {
		name := fl.Name
		if long, ok := f.Shorthands[name]; ok {
			name = long
		}
		f.SetBy[name] = "flag"
		delete(envErrs, name)
	})
	if err := f.applyConfigFile(); err != nil {
		return nil, err
	}
	if len(envErrs) > 0 {
		names := make([]string, 0, len(envErrs))
		for n := range envErrs {
			names = append(names, n)
		}
		sort.Strings(names)
		errs := make([]error, len(names))
		for i, n := range names {
			errs[i] = envErrs[n]
		}
		return nil, &UsageError{msg: errors.Join(errs...).Error()}
	}
	for name, repl := range f.deprecated {
		if by, ok := f.SetBy[name]; ok {
			what := "--" + name
			switch {
			case strings.HasPrefix(by, "$"):
				what = by
			case by != "flag":
				what = by + ": " + name // a config file
			}
			fmt.Fprintf(f.Stderr, "pdplane: warning: %s is deprecated: use --%s ($%s)\n", what, repl, EnvName(repl))
		}
	}
	if ParseHook != nil {
		if err := ParseHook(f); err != nil {
			return nil, err
		}
	}
	if f.printConfig != nil && *f.printConfig {
		if err := f.writeConfig(f.Stdout); err != nil {
			return nil, fmt.Errorf("print the configuration: %w", err)
		}
		return nil, ErrPrinted
	}
	return pos, nil
}

// PrintUsage writes the synopsis and every flag with its variable and
// default.
func (f *FlagSet) PrintUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage:")
	syn := f.Synopsis
	if syn == "" {
		syn = "pdplane " + f.name + " [flags]"
	}
	for _, l := range strings.Split(strings.TrimRight(syn, "\n"), "\n") {
		fmt.Fprintln(w, "  "+l)
	}
	if f.About != "" {
		fmt.Fprintln(w)
		fmt.Fprintln(w, strings.TrimRight(f.About, "\n"))
	}
	fmt.Fprintln(w, "\nFlags:")
	short := map[string]string{}
	for s, l := range f.Shorthands {
		short[l] = s
	}
	f.VisitAll(func(fl *flag.Flag) {
		if _, ok := f.Shorthands[fl.Name]; ok {
			return
		}
		names := "--" + fl.Name
		if s, ok := short[fl.Name]; ok {
			names = "-" + s + ", " + names
		}
		kind := "value"
		if ev, ok := fl.Value.(envFlag); ok {
			kind = ev.kindName()
		}
		if kind != "bool" {
			names += " " + kind
		}
		help := fl.Usage
		env := "($" + EnvName(fl.Name) + ")"
		if !strings.Contains(help, env) {
			help += " " + env
		}
		if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" {
			help += fmt.Sprintf(" (default %q)", fl.DefValue)
		}
		fmt.Fprintf(w, "  %s\n        %s\n", names, help)
	})
	fmt.Fprintln(w, "  -h, --help\n        this help")
}

// FirstToken is the token an agent presents from a comma-separated list
// (the form --join-token takes for `serve` during a rotation): the first.
func FirstToken(list string) string {
	first, _, _ := strings.Cut(list, ",")
	return strings.TrimSpace(first)
}
