package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// redacted is what --print-config shows in place of a secret. In a config
// file it stands for a value that the environment or the command line must
// give.
const redacted = "<redacted>"

// ErrPrinted ends a command that printed what it was asked for
// (--print-config) and has nothing to run: exit status 0.
var ErrPrinted = errors.New("configuration printed")

// ConfigFile gives the command --config FILE, a YAML mapping of its flags'
// names to values read before the environment and the command line, and
// --print-config.
func (f *FlagSet) ConfigFile() {
	f.Config, f.printConfig = new(string), new(bool)
	f.Add(&value[string]{p: f.Config, f: f, name: "config", kind: "file", want: "a file name",
		parse: func(s string) (string, error) { return s, nil }, format: func(s string) string { return s },
		sample: os.DevNull}, "config", "YAML file of this command's flags (lease-ttl: 10s; a list such as [a, b] where a flag takes "+
		"a comma-separated one); the environment and the command line override it")
	f.Bool(f.printConfig, "print-config", false, "print the resulting configuration (file, environment, command line, defaults) "+
		"as YAML that --config reads, and exit; secrets are shown as "+redacted+", which --config takes to mean: from the "+
		"environment or the command line")
}

// applyConfigFile sets, from --config's file, the flags that neither the
// environment nor the command line set, and checks the file's other values.
// Every bad key is reported, each with the file's name.
func (f *FlagSet) applyConfigFile() error {
	if f.Config == nil || *f.Config == "" {
		return nil
	}
	path := *f.Config
	m, err := readConfigFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			by := "--config"
			if s := f.SetBy["config"]; s != "flag" {
				by = s
			}
			return Usagef("%s: %v", by, err)
		}
		return Usagef("%s: %v", path, err)
	}
	var errs []error
	seen := map[string]bool{}
	for i := 0; m != nil && i+1 < len(m.Content); i += 2 {
		key, val := m.Content[i].Value, m.Content[i+1]
		if err := f.applyConfigKey(path, key, val, seen); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return &UsageError{msg: errors.Join(errs...).Error()}
	}
	return nil
}

// applyConfigKey sets or checks one key of the config file at path.
func (f *FlagSet) applyConfigKey(path, key string, val *yaml.Node, seen map[string]bool) error {
	fl := f.Lookup(key)
	_, short := f.Shorthands[key]
	switch {
	case key == "config" || key == "print-config":
		return fmt.Errorf("%s: %s: only a command-line flag", path, key)
	case fl == nil || short:
		return fmt.Errorf("%s: unknown key %q (see 'pdplane %s -h')", path, key, f.name)
	case seen[key]:
		return fmt.Errorf("%s: %s: given twice", path, key)
	}
	seen[key] = true
	ev := fl.Value.(envFlag) // every flag of a FlagSet is
	s, isSeq, err := configText(val)
	switch {
	case err != nil:
		return fmt.Errorf("%s: %s: %w", path, key, err)
	case isSeq && !ev.isList():
		return fmt.Errorf("%s: %s: a list, but --%s takes one value", path, key, key)
	}
	_, overridden := f.SetBy[key]
	switch {
	case s == redacted && !overridden:
		return fmt.Errorf("%s: %s: %s stands for a secret that --print-config hid: give it as $%s or --%s",
			path, key, redacted, EnvName(key), key)
	case s == redacted:
	case overridden:
		err = ev.check(s)
	default:
		if err = fl.Value.Set(s); err == nil {
			f.SetBy[key] = path
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %s: %w", path, key, err)
	}
	return nil
}

// readConfigFile reads a config file: a YAML mapping, or nothing (a file
// of comments configures nothing, and returns nil).
func readConfigFile(path string) (*yaml.Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	if err := dec.Decode(new(yaml.Node)); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("more than one YAML document")
		}
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	m := doc.Content[0]
	switch {
	case m.ShortTag() == "!!null":
		return nil, nil
	case m.Kind != yaml.MappingNode:
		return nil, fmt.Errorf("want a mapping of flag names to values (lease-ttl: 10s), not a %s", kindOf(m))
	}
	return m, nil
}

// configText is a config file's value as a flag takes it: a scalar in its
// text form (null as empty), a sequence of scalars joined with commas.
func configText(n *yaml.Node) (s string, isSeq bool, err error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "", false, nil
		}
		return n.Value, false, nil
	case yaml.SequenceNode:
		items := make([]string, len(n.Content))
		for i, it := range n.Content {
			var seq bool
			if items[i], seq, err = configText(it); err != nil || seq {
				return "", true, errors.New("want a list of values, not of lists or mappings")
			}
		}
		return strings.Join(items, ","), true, nil
	}
	return "", false, fmt.Errorf("want a value or a list of values, not a %s", kindOf(n))
}

func kindOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	}
	return "value"
}

// writeConfig writes every flag's value as a config file: in name order,
// lists as YAML sequences, secrets as <redacted>, deprecated flags only
// when set. --config and --print-config are left out.
func (f *FlagSet) writeConfig(w io.Writer) error {
	m := &yaml.Node{Kind: yaml.MappingNode}
	f.VisitAll(func(fl *flag.Flag) {
		name := fl.Name
		_, short := f.Shorthands[name]
		_, deprecated := f.deprecated[name]
		_, set := f.SetBy[name]
		if short || name == "config" || name == "print-config" || deprecated && !set {
			return
		}
		m.Content = append(m.Content, scalar("!!str", name), configNode(name, fl.Value))
	})
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{m}, HeadComment: fmt.Sprintf(
		"pdplane %s --print-config: every flag's value, from the config file, the\n"+
			"environment, the command line or its default. A secret reads %s:\n"+
			"with this file as --config, it must come from the environment or the\n"+
			"command line.", f.name, redacted)}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return enc.Close()
}

// configNode is one flag's value as writeConfig writes it.
func configNode(name string, v flag.Value) *yaml.Node {
	s := v.String()
	if secret(name, s) {
		return scalar("!!str", redacted)
	}
	ev, ok := v.(envFlag)
	if !ok {
		return scalar("!!str", s)
	}
	if ev.isList() {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		if s != "" {
			for _, item := range strings.Split(s, ",") {
				seq.Content = append(seq.Content, scalar("!!str", item))
			}
		}
		return seq
	}
	switch ev.kindName() {
	case "int":
		return scalar("!!int", s)
	case "bool":
		return scalar("!!bool", s)
	}
	return scalar("!!str", s)
}

// scalar is a value node. A string that YAML 1.1 reads as a boolean (yes,
// off) is quoted, so that other tools that read the output take it as the
// string it is.
func scalar(tag, value string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value}
	switch strings.ToLower(value) {
	case "y", "yes", "n", "no", "on", "off":
		if tag == "!!str" {
			n.Style = yaml.DoubleQuotedStyle
		}
	}
	return n
}

// secret says whether --print-config hides a flag's value: a token, an API
// key, a credential, a secret or a password, and a database URL that holds
// a password. A flag naming a file (--credential-file) holds a path, not
// the secret; an empty value hides nothing.
func secret(name, value string) bool {
	switch {
	case value == "" || strings.HasSuffix(name, "-file"):
		return false
	case name == "database-url":
		u, err := url.Parse(value)
		if err != nil {
			return true // cannot tell
		}
		_, hasPassword := u.User.Password()
		return hasPassword || strings.Contains(value, "password=")
	}
	for _, s := range []string{"token", "api-keys", "credential", "secret", "password"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}
