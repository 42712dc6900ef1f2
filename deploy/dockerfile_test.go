package deploy_test

// The repository's Dockerfile, checked offline (nothing is built): its two
// images are there, the control-plane image carries no NIXL and runs as a
// non-root user with a HEALTHCHECK, the agent image's PDPLANE_NIXL_LIB and
// NIXL_PLUGIN_DIR are where its COPY puts them (and where the nixl stage
// checks the files are), every COPY --from names a stage, and ENTRYPOINT,
// CMD and HEALTHCHECK run pdplane subcommands, with flags, that the binary
// built from this tree accepts. hadolint runs when installed
// (scripts/install-hadolint.sh; required under CI=true).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const dockerfilePath = "../Dockerfile"

// dfInstr is one Dockerfile instruction, continuation lines joined.
type dfInstr struct {
	cmd   string            // upper case: FROM, COPY, ...
	flags map[string]string // leading --name=value options
	rest  string            // the arguments after the options
	line  int
}

// exec returns the arguments of an exec-form (JSON array) instruction.
func (i dfInstr) exec() ([]string, error) {
	var args []string
	if !strings.HasPrefix(i.rest, "[") {
		return nil, fmt.Errorf("line %d: %s %s is not in exec form (a JSON array)", i.line, i.cmd, i.rest)
	}
	if err := json.Unmarshal([]byte(i.rest), &args); err != nil {
		return nil, fmt.Errorf("line %d: %s: %v", i.line, i.cmd, err)
	}
	return args, nil
}

type dfStage struct {
	name, base string
	line       int
	instrs     []dfInstr // after FROM
}

// last returns the stage's last instruction named cmd.
func (s *dfStage) last(cmd string) (dfInstr, bool) {
	for i := len(s.instrs) - 1; i >= 0; i-- {
		if s.instrs[i].cmd == cmd {
			return s.instrs[i], true
		}
	}
	return dfInstr{}, false
}

func (s *dfStage) all(cmd string) []dfInstr {
	var out []dfInstr
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// env returns the stage's ENV variables (the last value of each).
func (s *dfStage) env(t *testing.T) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, in := range s.all("ENV") {
		words, err := shellWords(in.rest)
		if err != nil {
			t.Fatalf("line %d: ENV: %v", in.line, err)
		}
		for _, w := range words {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				t.Fatalf("line %d: ENV %q: use KEY=VALUE", in.line, in.rest)
			}
			env[k] = v
		}
	}
	return env
}

type dockerfile struct {
	stages []*dfStage
}

func (d *dockerfile) stage(name string) *dfStage {
	for _, s := range d.stages {
		if s.name == name {
			return s
		}
	}
	return nil
}

// loadTarget loads the Dockerfile and its stage named target, failing the
// test when there is none.
func loadTarget(t *testing.T, target string) (*dockerfile, *dfStage) {
	t.Helper()
	d := loadDockerfile(t)
	s := d.stage(target)
	if s == nil {
		t.Fatalf("no %s stage", target)
	}
	return d, s
}

var knownInstr = []string{"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
	"VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}

// parseDockerfile reads instructions: comments and blank lines skipped
// (inside continuations too), lines ending in a backslash joined, leading
// --flag=value options split off. Heredocs are refused.
func parseDockerfile(data string) (*dockerfile, error) {
	d := &dockerfile{}
	var cur strings.Builder
	start := 0
	flush := func() error {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return nil
		}
		cmd, rest, _ := strings.Cut(text, " ")
		in := dfInstr{cmd: strings.ToUpper(cmd), flags: map[string]string{}, line: start}
		if !slices.Contains(knownInstr, in.cmd) {
			return fmt.Errorf("line %d: unknown instruction %q", start, cmd)
		}
		rest = strings.TrimSpace(rest)
		for strings.HasPrefix(rest, "--") {
			opt, after, _ := strings.Cut(rest, " ")
			k, v, _ := strings.Cut(strings.TrimPrefix(opt, "--"), "=")
			in.flags[k] = v
			rest = strings.TrimSpace(after)
		}
		in.rest = rest
		if strings.Contains(rest, "<<") && (in.cmd == "RUN" || in.cmd == "COPY") {
			return fmt.Errorf("line %d: heredocs are not supported by this check", start)
		}
		if in.cmd == "FROM" {
			f := strings.Fields(rest)
			st := &dfStage{line: start}
			switch {
			case len(f) == 1:
				st.base = f[0]
			case len(f) == 3 && strings.EqualFold(f[1], "AS"):
				st.base, st.name = f[0], f[2]
			default:
				return fmt.Errorf("line %d: FROM %q", start, rest)
			}
			d.stages = append(d.stages, st)
			return nil
		}
		if len(d.stages) == 0 {
			if in.cmd == "ARG" {
				return nil // global ARG before the first FROM
			}
			return fmt.Errorf("line %d: %s before the first FROM", start, in.cmd)
		}
		s := d.stages[len(d.stages)-1]
		s.instrs = append(s.instrs, in)
		return nil
	}
	sc := bufio.NewScanner(strings.NewReader(data))
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if body, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: the file ends in a continuation", start)
	}
	return d, nil
}

// shellWords splits s as a shell would split plain words: blanks separate,
// "..." and '...' quote, a backslash escapes the next character.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	in, quote, esc := false, rune(0), false
	for _, r := range s {
		switch {
		case esc:
			w.WriteRune(r)
			esc, in = false, true
		case r == '\\' && quote != '\'':
			esc = true
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				w.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if quote != 0 || esc {
		return nil, fmt.Errorf("unterminated quote or escape in %q", s)
	}
	if in {
		words = append(words, w.String())
	}
	return words, nil
}

// copyArgs returns a COPY's sources and destination.
func copyArgs(in dfInstr) (srcs []string, dest string, err error) {
	words, err := in.exec()
	if err != nil {
		if words, err = shellWords(in.rest); err != nil {
			return nil, "", err
		}
	}
	if len(words) < 2 {
		return nil, "", fmt.Errorf("line %d: COPY %q needs a source and a destination", in.line, in.rest)
	}
	return words[:len(words)-1], words[len(words)-1], nil
}

func loadDockerfile(t *testing.T) *dockerfile {
	t.Helper()
	data, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDockerfile(string(data))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	return d
}

// The two images and where the build stage leaves the binary.
const (
	controlplaneTarget = "controlplane"
	agentTarget        = "agent"
	builtBinary        = "/out/pdplane"
)

var nixlText = regexp.MustCompile(`(?i)nixl|ucx`)

func TestDockerfileParserRefuses(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"RUN true\n",                  // before FROM
		"FROM a AS\n",                 // bad FROM
		"FROM a\nFROB x\n",            // unknown instruction
		"FROM a\nRUN x \\\n",          // ends in a continuation
		"FROM a\nRUN <<EOF\nx\nEOF\n", // heredoc
	} {
		if _, err := parseDockerfile(bad); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
	d, err := parseDockerfile("# syntax=docker/dockerfile:1\nARG X=1\nFROM a:1 AS b\nCOPY --from=c \\\n  # note\n  /x /y\nENV A=\"1 2\" B=3\n")
	if err != nil {
		t.Fatal(err)
	}
	s := d.stage("b")
	if s == nil || len(s.instrs) != 2 || s.instrs[0].flags["from"] != "c" || s.instrs[0].rest != "/x /y" {
		t.Fatalf("parsed %+v", d.stages[0])
	}
	if env := s.env(t); env["A"] != "1 2" || env["B"] != "3" {
		t.Fatalf("env %v", env)
	}
}

// TestDockerfileStages: both images exist, the control plane is the
// default target, every COPY --from names an earlier stage, external bases
// are pinned by a tag, context COPYs name files the context holds.
func TestDockerfileStages(t *testing.T) {
	t.Parallel()
	d := loadDockerfile(t)
	for _, want := range []string{controlplaneTarget, agentTarget} {
		if d.stage(want) == nil {
			t.Errorf("no stage %q: `docker build --target %s` would fail", want, want)
		}
	}
	if last := d.stages[len(d.stages)-1]; last.name != controlplaneTarget {
		t.Errorf("the last stage (a plain `docker build .`) is %q, want %q", last.name, controlplaneTarget)
	}
	ignore := dockerignore(t)
	var seen []string
	for _, s := range d.stages {
		if !slices.Contains(seen, s.base) {
			ref := s.base
			if _, digest, ok := strings.Cut(ref, "@"); ok && !strings.HasPrefix(digest, "sha256:") {
				t.Errorf("line %d: FROM %s: bad digest", s.line, ref)
			}
			ref, _, _ = strings.Cut(ref, "@")
			tag := ref[strings.LastIndex(ref, "/")+1:]
			if _, tag, ok := strings.Cut(tag, ":"); !ok || tag == "" || tag == "latest" {
				t.Errorf("line %d: FROM %s is not pinned by a tag", s.line, s.base)
			}
		}
		for _, in := range s.all("ADD") {
			t.Errorf("line %d: ADD: use COPY", in.line)
		}
		for _, in := range s.all("COPY") {
			srcs, _, err := copyArgs(in)
			if err != nil {
				t.Error(err)
				continue
			}
			if from, ok := in.flags["from"]; ok {
				if !slices.Contains(seen, from) {
					t.Errorf("line %d: COPY --from=%s names no earlier stage", in.line, from)
				}
				continue
			}
			for _, src := range srcs {
				checkContextPath(t, in.line, src, ignore)
			}
		}
		if s.name != "" {
			seen = append(seen, s.name)
		}
	}
}

// dockerignore returns .dockerignore's patterns.
func dockerignore(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatalf(".dockerignore: %v (without it the context carries .venv, hundreds of MB)", err)
	}
	var pats []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			pats = append(pats, strings.TrimPrefix(l, "/"))
		}
	}
	for _, must := range []string{".git", ".venv"} {
		if !slices.Contains(pats, must) {
			t.Errorf(".dockerignore does not exclude %s", must)
		}
	}
	return pats
}

// checkContextPath: a COPY source from the build context exists in the
// repository and .dockerignore does not exclude it or a folder above it.
func checkContextPath(t *testing.T, line int, src string, ignore []string) {
	t.Helper()
	if src == "." || src == "./" {
		return
	}
	if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(src))); err != nil {
		t.Errorf("line %d: COPY %s: not in the repository: %v", line, src, err)
		return
	}
	for p := path.Clean(src); p != "." && p != "/"; p = path.Dir(p) {
		for _, pat := range ignore {
			if ok, _ := path.Match(pat, p); ok {
				t.Errorf("line %d: COPY %s: .dockerignore excludes it (%s)", line, src, pat)
			}
		}
	}
}

// nixlStages returns the stages that hold NIXL or UCX, and those built
// FROM or COPYing from them.
func nixlStages(d *dockerfile) []string {
	var out []string
	for _, s := range d.stages {
		carries := slices.Contains(out, s.base)
		for _, in := range s.instrs {
			if (in.cmd == "RUN" || in.cmd == "COPY" || in.cmd == "ENV") && nixlText.MatchString(in.rest) ||
				slices.Contains(out, in.flags["from"]) {
				carries = true
			}
		}
		if carries && s.name != "" {
			out = append(out, s.name)
		}
	}
	return out
}

// checkUser: the stage's last USER is a numeric, non-root uid (Kubernetes'
// runAsNonRoot can only verify a numeric one).
func checkUser(t *testing.T, s *dfStage) {
	t.Helper()
	in, ok := s.last("USER")
	if !ok {
		t.Errorf("%s: no USER: the image runs as root", s.name)
		return
	}
	uid, _, _ := strings.Cut(in.rest, ":")
	n, err := strconv.Atoi(uid)
	if err != nil || n == 0 {
		t.Errorf("line %d: %s: USER %s: want a numeric non-root uid", in.line, s.name, in.rest)
	}
}

// TestDockerfileControlPlane: no NIXL or UCX gets in, a non-root user, the
// serve port exposed and probed by a HEALTHCHECK that needs no shell.
func TestDockerfileControlPlane(t *testing.T) {
	t.Parallel()
	d, s := loadTarget(t, controlplaneTarget)
	carriers := nixlStages(d)
	if d.stage(s.base) != nil {
		t.Errorf("%s is built FROM stage %s: start from a base image", s.name, s.base)
	}
	if slices.Contains(carriers, s.name) {
		t.Errorf("%s carries NIXL/UCX (stages that do: %v)", s.name, carriers)
	}
	for _, in := range s.all("COPY") {
		if from := in.flags["from"]; from != "" && slices.Contains(carriers, from) {
			t.Errorf("line %d: %s copies from %s, which holds NIXL/UCX", in.line, s.name, from)
		}
	}
	env := s.env(t)
	for k := range env {
		if nixlText.MatchString(k) {
			t.Errorf("%s sets %s: it has no NIXL", s.name, k)
		}
	}
	checkUser(t, s)

	expose, ok := s.last("EXPOSE")
	if !ok {
		t.Fatalf("%s: no EXPOSE", s.name)
	}
	port, _, _ := strings.Cut(expose.rest, "/")
	addr := env["PDPLANE_ADDR"]
	if _, p, err := net.SplitHostPort(addr); err != nil || p != port {
		t.Errorf("%s: EXPOSE %s but PDPLANE_ADDR=%q: serve must listen on the exposed port, on all interfaces", s.name, port, addr)
	}

	hc, ok := s.last("HEALTHCHECK")
	if !ok || strings.EqualFold(hc.rest, "NONE") {
		t.Fatalf("%s: no HEALTHCHECK", s.name)
	}
	cmdWord, rest, _ := strings.Cut(hc.rest, " ")
	if cmdWord != "CMD" {
		t.Fatalf("line %d: HEALTHCHECK %s: want HEALTHCHECK [options] CMD [...]", hc.line, hc.rest)
	}
	args, err := (dfInstr{cmd: "HEALTHCHECK CMD", rest: strings.TrimSpace(rest), line: hc.line}).exec()
	if err != nil {
		t.Fatalf("%v (the base has no shell)", err)
	}
	if len(args) < 2 || args[1] != "healthcheck" {
		t.Fatalf("line %d: HEALTHCHECK runs %q, want pdplane healthcheck", hc.line, args)
	}
	checkBinary(t, d, s, args[0])
	set := checkSubcommand(t, args[1], args[2:])
	// The probe's URL is the one serve listens on: its default follows
	// PDPLANE_ADDR as the image sets it.
	want := "http://127.0.0.1:" + port + "/healthz"
	if u, ok := set["url"]; ok {
		if u != want {
			t.Errorf("HEALTHCHECK --url=%s, want %s", u, want)
		}
	} else {
		cmd := exec.Command(pdplaneBin, "healthcheck", "-h")
		cmd.Env = append(os.Environ(), "PDPLANE_ADDR="+addr)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), `(default "`+want+`")`) {
			t.Errorf("with PDPLANE_ADDR=%s, pdplane healthcheck does not default to %s:\n%s", addr, want, out)
		}
	}
}

// TestDockerfileAgent: PDPLANE_NIXL_LIB and NIXL_PLUGIN_DIR point into what
// a COPY --from puts in the image, at files that stage checks exist, in the
// layout of the real wheel when the repository's .venv has it.
func TestDockerfileAgent(t *testing.T) {
	t.Parallel()
	d, s := loadTarget(t, agentTarget)
	checkUser(t, s)
	env := s.env(t)
	for _, c := range []struct{ key, file string }{
		{"PDPLANE_NIXL_LIB", ""},
		{"NIXL_PLUGIN_DIR", "libplugin_UCX.so"},
	} {
		val := env[c.key]
		if !path.IsAbs(val) {
			t.Errorf("%s: %s=%q, want an absolute path", s.name, c.key, val)
			continue
		}
		file := path.Join(val, c.file)
		found := false
		for _, in := range s.all("COPY") {
			from := in.flags["from"]
			srcs, dest, err := copyArgs(in)
			if err != nil || from == "" || len(srcs) != 1 {
				continue
			}
			rel, ok := strings.CutPrefix(file, strings.TrimSuffix(dest, "/")+"/")
			if !ok {
				continue
			}
			found = true
			src := d.stage(from)
			if src == nil {
				t.Errorf("line %d: COPY --from=%s: no such stage", in.line, from)
				break
			}
			check := "test -f " + path.Join(srcs[0], rel)
			if !slices.ContainsFunc(src.all("RUN"), func(r dfInstr) bool { return strings.Contains(r.rest, check) }) {
				t.Errorf("%s=%s: stage %s never runs `%s`, so a build would not notice it missing", c.key, val, from, check)
			}
			checkWheelLayout(t, rel)
		}
		if !found {
			t.Errorf("%s=%s: no COPY --from puts %s there", c.key, val, file)
		}
	}
}

// checkWheelLayout: rel, a path inside the copied NIXL folder, exists in
// the nixl-cu12 wheel installed in the repository's .venv, when there is one.
func checkWheelLayout(t *testing.T, rel string) {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join("..", ".venv", "lib", "python3*", "site-packages", filepath.FromSlash(rel)))
	if len(m) > 0 {
		return
	}
	if w, _ := filepath.Glob(filepath.Join("..", ".venv", "lib", "python3*", "site-packages", ".nixl_cu12.mesonpy.libs")); len(w) > 0 {
		t.Errorf("the nixl-cu12 wheel in .venv has no %s: the image's path does not match the wheel's layout", rel)
		return
	}
	t.Logf("no nixl-cu12 in ../.venv: %s not checked against the wheel (scripts/install-nixl.sh)", rel)
}

// checkBinary: bin is where a COPY puts the binary the build stage makes
// with the flags a release needs.
func checkBinary(t *testing.T, d *dockerfile, s *dfStage, bin string) {
	t.Helper()
	for _, in := range s.all("COPY") {
		srcs, dest, err := copyArgs(in)
		if err != nil || len(srcs) != 1 || srcs[0] != builtBinary || dest != bin {
			continue
		}
		b := d.stage(in.flags["from"])
		if b == nil {
			t.Errorf("line %d: COPY --from=%s: no such stage", in.line, in.flags["from"])
			return
		}
		build, download := -1, -1
		for i, r := range b.instrs {
			if r.cmd == "RUN" && strings.Contains(r.rest, "-o "+builtBinary+" ./cmd/pdplane") {
				build = i
				for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version="} {
					if !strings.Contains(r.rest, want) {
						t.Errorf("line %d: the build lacks %s", r.line, want)
					}
				}
			}
			if r.cmd == "RUN" && strings.Contains(r.rest, "go mod download") {
				download = i
			}
		}
		if build < 0 {
			t.Errorf("stage %s does not build %s from ./cmd/pdplane", b.name, builtBinary)
		}
		if download < 0 || download > build {
			t.Errorf("stage %s: no `go mod download` layer before the build", b.name)
		}
		return
	}
	t.Errorf("%s: nothing copies %s to %s", s.name, builtBinary, bin)
}

// checkSubcommand: `pdplane SUB -h` exits 0 and accepts args; returns the
// flags set.
func checkSubcommand(t *testing.T, sub string, args []string) map[string]string {
	t.Helper()
	if out, err := exec.Command(pdplaneBin, sub, "-h").CombinedOutput(); err != nil {
		t.Errorf("pdplane %s -h: %v\n%s", sub, err, out)
		return nil
	}
	set, err := parseArgs(helpFlags(t, sub), args)
	if err != nil {
		t.Error(err)
	}
	return set
}

// TestDockerfileCommands: each image's ENTRYPOINT is the copied binary and
// its CMD a subcommand, with flags, the binary accepts.
func TestDockerfileCommands(t *testing.T) {
	t.Parallel()
	d := loadDockerfile(t)
	for target, sub := range map[string]string{controlplaneTarget: "serve", agentTarget: "agent"} {
		s := d.stage(target)
		if s == nil {
			t.Errorf("no %s stage", target)
			continue
		}
		ep, ok := s.last("ENTRYPOINT")
		if !ok {
			t.Errorf("%s: no ENTRYPOINT", target)
			continue
		}
		entry, err := ep.exec()
		if err != nil || len(entry) != 1 {
			t.Errorf("%s: ENTRYPOINT %s: want [\"/path/to/pdplane\"] (%v)", target, ep.rest, err)
			continue
		}
		checkBinary(t, d, s, entry[0])
		cm, ok := s.last("CMD")
		if !ok {
			t.Errorf("%s: no CMD", target)
			continue
		}
		args, err := cm.exec()
		if err != nil || len(args) == 0 {
			t.Errorf("%s: CMD %s: want an exec-form subcommand (%v)", target, cm.rest, err)
			continue
		}
		if args[0] != sub {
			t.Errorf("%s: CMD runs pdplane %s, want %s", target, args[0], sub)
		}
		checkSubcommand(t, args[0], args[1:])
	}
}

// TestHadolint lints the Dockerfile with hadolint: $PDPLANE_HADOLINT, else
// on PATH, else in the repository's .venv (scripts/install-hadolint.sh).
// Required under CI=true.
func TestHadolint(t *testing.T) {
	t.Parallel()
	tool := os.Getenv("PDPLANE_HADOLINT")
	if tool == "" {
		tool, _ = exec.LookPath("hadolint")
	}
	if tool == "" {
		if p := filepath.Join("..", ".venv", "bin", "hadolint"); fileExists(p) {
			tool = p
		}
	}
	if tool == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("hadolint not found; under CI=true it is required (scripts/install-hadolint.sh)")
		}
		t.Skip("hadolint not found: the Dockerfile is not linted (scripts/install-hadolint.sh installs it into .venv)")
	}
	out, err := exec.Command(tool, "--no-color", dockerfilePath).CombinedOutput()
	if err != nil {
		t.Errorf("hadolint %s: %v\n%s", dockerfilePath, err, out)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
