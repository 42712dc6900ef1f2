package deploy_test

// The Kubernetes manifests, checked offline: every document strict-decodes
// into its k8s.io/api type (unknown kinds and unknown fields fail), and the
// references between documents, to operator-provided objects and to the
// pdplane binary's flags hold.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const k8sDir = "kubernetes"

// pdplaneImage is the image name the manifests give pdplane containers
// (kustomization.yaml's images entry rewrites it).
const pdplaneImage = "pdplane"

// operatorSecrets are the Secrets the manifests reference but do not
// declare, with their keys: tokens and a database URL must not sit in a
// repository, even as placeholders that an apply would ship. deploy/README.md
// must say how to create each one (TestOperatorProvidedObjectsDocumented).
var operatorSecrets = map[string][]string{
	"pdplane-database": {"url"},
	"pdplane-tokens":   {"join-token", "admin-token"},
}

// operatorClaims are the PersistentVolumeClaims the manifests reference but
// do not declare (the model files), documented the same way.
var operatorClaims = []string{"pdplane-models"}

// newObject maps apiVersion and kind to the type a document decodes into.
// Any other kind fails: extend this table, with the checks the kind needs,
// before adding one.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, true
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, true
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, true
	}
	return nil, false
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// strictJSON converts one YAML document to JSON, refusing duplicate keys,
// and decodes it into v refusing unknown fields.
func strictJSON(doc []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

// decodeDocs decodes every YAML document of one file into its typed object.
func decodeDocs(name string, data []byte) ([]any, error) {
	var objs []any
	for i, doc := range docSeparator.Split(string(data), -1) {
		j, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s document %d: %w", name, i, err)
		}
		if string(j) == "null" {
			continue // comments only
		}
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(j, &tm); err != nil {
			return nil, fmt.Errorf("%s document %d: %w", name, i, err)
		}
		obj, ok := newObject(tm.APIVersion, tm.Kind)
		if !ok {
			hint := ""
			if tm.Kind == "Secret" {
				hint = " (Secrets are operator-provided: see operatorSecrets)"
			}
			return nil, fmt.Errorf("%s document %d: unexpected kind %q %q%s", name, i, tm.APIVersion, tm.Kind, hint)
		}
		if err := strictJSON([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("%s document %d (%s): %w", name, i, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// kustomization is the part of kustomization.yaml the manifests use; any
// other field fails the strict decode, so a new one gets a check here.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
	ConfigMapGenerator []struct {
		Name  string   `json:"name"`
		Files []string `json:"files"` // [KEY=]PATH, relative to the kustomization
	} `json:"configMapGenerator"`
}

// podTemplate is a workload's pod template, named for messages.
type podTemplate struct {
	owner  string
	labels map[string]string
	spec   *corev1.PodSpec
}

// manifests is everything kustomization.yaml ties together.
type manifests struct {
	kust            kustomization
	serviceAccounts map[string]*corev1.ServiceAccount
	services        map[string]*corev1.Service
	deployments     map[string]*appsv1.Deployment
	statefulSets    map[string]*appsv1.StatefulSet
	pdbs            map[string]*policyv1.PodDisruptionBudget
	roles           map[string]*rbacv1.Role
	roleBindings    map[string]*rbacv1.RoleBinding
	pods            []podTemplate
	// configMaps are the generated ConfigMaps: name → key → the file
	// (path from this folder) the key holds.
	configMaps map[string]map[string]string
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{
		serviceAccounts: map[string]*corev1.ServiceAccount{},
		services:        map[string]*corev1.Service{},
		deployments:     map[string]*appsv1.Deployment{},
		statefulSets:    map[string]*appsv1.StatefulSet{},
		pdbs:            map[string]*policyv1.PodDisruptionBudget{},
		roles:           map[string]*rbacv1.Role{},
		roleBindings:    map[string]*rbacv1.RoleBinding{},
		configMaps:      map[string]map[string]string{},
	}
	data, err := os.ReadFile(filepath.Join(k8sDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := strictJSON(data, &m.kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if m.kust.APIVersion != "kustomize.config.k8s.io/v1beta1" || m.kust.Kind != "Kustomization" {
		t.Fatalf("kustomization.yaml: apiVersion %q kind %q", m.kust.APIVersion, m.kust.Kind)
	}
	files, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			onDisk = append(onDisk, b)
		}
	}
	if got := slices.Sorted(slices.Values(m.kust.Resources)); !slices.Equal(got, onDisk) {
		t.Errorf("kustomization.yaml resources %v, want every manifest in %s/: %v", got, k8sDir, onDisk)
	}
	for _, g := range m.kust.ConfigMapGenerator {
		keys := map[string]string{}
		for _, f := range g.Files {
			key, file, ok := strings.Cut(f, "=")
			if !ok {
				key, file = filepath.Base(f), f
			}
			file = filepath.Join(k8sDir, filepath.FromSlash(file))
			if _, err := os.Stat(file); err != nil {
				t.Errorf("kustomization.yaml configMapGenerator %s: %v", g.Name, err)
			}
			keys[key] = file
		}
		m.configMaps[g.Name] = keys
	}
	seen := map[string]string{}
	for _, r := range m.kust.Resources {
		data, err := os.ReadFile(filepath.Join(k8sDir, r))
		if err != nil {
			t.Fatalf("kustomization.yaml resource: %v", err)
		}
		objs, err := decodeDocs(r, data)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			m.add(t, r, o, seen)
		}
	}
	return m
}

func (m *manifests) add(t *testing.T, file string, o any, seen map[string]string) {
	t.Helper()
	obj := o.(interface {
		metav1.Object
		runtime.Object
	}) // every type newObject makes
	kind, name, ns := obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), obj.GetNamespace()
	switch o := o.(type) {
	case *corev1.ServiceAccount:
		m.serviceAccounts[name] = o
	case *corev1.Service:
		m.services[name] = o
	case *appsv1.Deployment:
		m.deployments[name] = o
		m.pods = append(m.pods, podTemplate{"Deployment " + name, o.Spec.Template.Labels, &o.Spec.Template.Spec})
	case *appsv1.StatefulSet:
		m.statefulSets[name] = o
		m.pods = append(m.pods, podTemplate{"StatefulSet " + name, o.Spec.Template.Labels, &o.Spec.Template.Spec})
	case *policyv1.PodDisruptionBudget:
		m.pdbs[name] = o
	case *rbacv1.Role:
		m.roles[name] = o
	case *rbacv1.RoleBinding:
		m.roleBindings[name] = o
	}
	if name == "" {
		t.Errorf("%s: a %s without metadata.name", file, kind)
	}
	if ns != "" {
		t.Errorf("%s: %s %s sets metadata.namespace: leave it to `kubectl -n` or kustomize's namespace", file, kind, name)
	}
	key := kind + "/" + name
	if prev, dup := seen[key]; dup {
		t.Errorf("%s: %s declared again (first in %s)", file, key, prev)
	}
	seen[key] = file
}

// selects reports whether every selector label is among labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// hasPort reports whether a container exposes port (a number or a name).
func hasPort(c *corev1.Container, port intstr.IntOrString) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		if port.Type == intstr.String {
			return p.Name == port.StrVal
		}
		return p.ContainerPort == port.IntVal
	})
}

func isPdplane(c *corev1.Container) bool {
	name, _, _ := strings.Cut(c.Image, ":")
	return name == pdplaneImage
}

func TestManifestDecoderRefuses(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"unknown field": "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\nspec:\n  selectr: {a: b}\n",
		"unknown kind":  "apiVersion: v1\nkind: Secret\nmetadata:\n  name: a\nstringData:\n  url: x\n",
		"duplicate key": "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  name: b\n",
		"wrong type":    "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: a\nspec:\n  replicas: two\n",
		"second doc":    "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\nautomount: false\n",
	}
	for name, doc := range cases {
		if _, err := decodeDocs(name, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	objs, err := decodeDocs("good", []byte("# only a comment\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n"))
	if err != nil || len(objs) != 1 {
		t.Errorf("a valid file: got %d objects, %v", len(objs), err)
	}
}

func TestManifestReferences(t *testing.T) {
	t.Parallel()
	m := loadManifests(t)

	t.Run("workload selectors match their pod templates", func(t *testing.T) {
		for name, d := range m.deployments {
			if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
				t.Errorf("Deployment %s: selector does not match its pod template's labels", name)
			}
		}
		for name, s := range m.statefulSets {
			if s.Spec.Selector == nil || !selects(s.Spec.Selector.MatchLabels, s.Spec.Template.Labels) {
				t.Errorf("StatefulSet %s: selector does not match its pod template's labels", name)
			}
			svc, ok := m.services[s.Spec.ServiceName]
			if !ok {
				t.Errorf("StatefulSet %s: serviceName %q is not declared", name, s.Spec.ServiceName)
			} else if svc.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("StatefulSet %s: its Service %s is not headless", name, svc.Name)
			}
		}
		for name, p := range m.pdbs {
			if p.Spec.Selector == nil || !slices.ContainsFunc(m.pods, func(pt podTemplate) bool { return selects(p.Spec.Selector.MatchLabels, pt.labels) }) {
				t.Errorf("PodDisruptionBudget %s selects no pod template", name)
			}
		}
	})

	t.Run("services select pods that expose their target ports", func(t *testing.T) {
		for name, svc := range m.services {
			var selected []podTemplate
			for _, pt := range m.pods {
				if selects(svc.Spec.Selector, pt.labels) {
					selected = append(selected, pt)
				}
			}
			if len(selected) == 0 {
				t.Errorf("Service %s: selector %v matches no pod template", name, svc.Spec.Selector)
			}
			for _, sp := range svc.Spec.Ports {
				target := sp.TargetPort
				if target.Type == intstr.Int && target.IntVal == 0 {
					target = intstr.FromInt32(sp.Port)
				}
				for _, pt := range selected {
					if !slices.ContainsFunc(pt.spec.Containers, func(c corev1.Container) bool { return hasPort(&c, target) }) {
						t.Errorf("Service %s port %d: target %s is no container port of %s", name, sp.Port, target.String(), pt.owner)
					}
				}
			}
		}
	})

	t.Run("probes name ports of their own container", func(t *testing.T) {
		for _, pt := range m.pods {
			for _, c := range pt.spec.Containers {
				for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
					if p == nil {
						continue
					}
					var port intstr.IntOrString
					switch {
					case p.HTTPGet != nil:
						port = p.HTTPGet.Port
					case p.TCPSocket != nil:
						port = p.TCPSocket.Port
					default:
						continue
					}
					if !hasPort(&c, port) {
						t.Errorf("%s container %s: %s probe port %s is not one of its ports", pt.owner, c.Name, what, port.String())
					}
				}
			}
		}
	})

	t.Run("service accounts and RBAC references exist", func(t *testing.T) {
		for _, pt := range m.pods {
			if _, ok := m.serviceAccounts[pt.spec.ServiceAccountName]; !ok {
				t.Errorf("%s: serviceAccountName %q is not declared", pt.owner, pt.spec.ServiceAccountName)
			}
		}
		for name, rb := range m.roleBindings {
			if rb.RoleRef.Kind != "Role" || rb.RoleRef.APIGroup != rbacv1.GroupName {
				t.Errorf("RoleBinding %s: roleRef %s/%s, want a Role of %s", name, rb.RoleRef.APIGroup, rb.RoleRef.Kind, rbacv1.GroupName)
			} else if _, ok := m.roles[rb.RoleRef.Name]; !ok {
				t.Errorf("RoleBinding %s: Role %q is not declared", name, rb.RoleRef.Name)
			}
			if len(rb.Subjects) == 0 {
				t.Errorf("RoleBinding %s binds nobody", name)
			}
			for _, s := range rb.Subjects {
				if s.Kind != rbacv1.ServiceAccountKind {
					t.Errorf("RoleBinding %s: subject kind %q, want ServiceAccount", name, s.Kind)
				} else if _, ok := m.serviceAccounts[s.Name]; !ok {
					t.Errorf("RoleBinding %s: ServiceAccount %q is not declared", name, s.Name)
				}
			}
		}
	})

	t.Run("secrets and volume claims are the operator-provided ones", func(t *testing.T) {
		usedSecrets := map[string]bool{}
		checkSecret := func(owner, name, key string) {
			keys, ok := operatorSecrets[name]
			switch {
			case !ok:
				t.Errorf("%s: Secret %q is neither declared nor operator-provided (operatorSecrets)", owner, name)
			case key != "" && !slices.Contains(keys, key):
				t.Errorf("%s: Secret %s has no key %q among the operator-provided %v", owner, name, key, keys)
			}
			usedSecrets[name+"/"+key] = true
		}
		usedClaims := map[string]bool{}
		for _, pt := range m.pods {
			for _, c := range slices.Concat(pt.spec.InitContainers, pt.spec.Containers) {
				for _, e := range c.Env {
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
						checkSecret(pt.owner+" container "+c.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
					}
				}
				for _, e := range c.EnvFrom {
					if e.SecretRef != nil {
						checkSecret(pt.owner+" container "+c.Name, e.SecretRef.Name, "")
					}
				}
			}
			for _, v := range pt.spec.Volumes {
				if v.Secret != nil {
					checkSecret(pt.owner+" volume "+v.Name, v.Secret.SecretName, "")
				}
				if v.PersistentVolumeClaim != nil {
					if !slices.Contains(operatorClaims, v.PersistentVolumeClaim.ClaimName) {
						t.Errorf("%s volume %s: PersistentVolumeClaim %q is neither declared nor operator-provided (operatorClaims)", pt.owner, v.Name, v.PersistentVolumeClaim.ClaimName)
					}
					usedClaims[v.PersistentVolumeClaim.ClaimName] = true
				}
			}
		}
		for name, keys := range operatorSecrets {
			for _, k := range keys {
				if !usedSecrets[name+"/"+k] {
					t.Errorf("operatorSecrets lists %s key %s, which no manifest uses", name, k)
				}
			}
		}
		for _, c := range operatorClaims {
			if !usedClaims[c] {
				t.Errorf("operatorClaims lists %s, which no manifest uses", c)
			}
		}
	})

	t.Run("config map volumes name generated ConfigMaps", func(t *testing.T) {
		used := map[string]bool{}
		for _, pt := range m.pods {
			for _, v := range pt.spec.Volumes {
				if v.ConfigMap == nil {
					continue
				}
				if _, ok := m.configMaps[v.ConfigMap.Name]; !ok {
					t.Errorf("%s volume %s: ConfigMap %q is not generated by kustomization.yaml", pt.owner, v.Name, v.ConfigMap.Name)
				}
				used[v.ConfigMap.Name] = true
			}
		}
		for name := range m.configMaps {
			if !used[name] {
				t.Errorf("kustomization.yaml generates ConfigMap %s, which no pod mounts", name)
			}
		}
	})

	t.Run("kustomization images name containers", func(t *testing.T) {
		for _, img := range m.kust.Images {
			if !slices.ContainsFunc(m.pods, func(pt podTemplate) bool {
				return slices.ContainsFunc(pt.spec.Containers, func(c corev1.Container) bool {
					name, _, _ := strings.Cut(c.Image, ":")
					return name == img.Name
				})
			}) {
				t.Errorf("kustomization.yaml images: %q is no container's image", img.Name)
			}
		}
	})
}

// TestOperatorProvidedObjectsDocumented: every Secret key and claim the
// manifests expect from the operator is created in deploy/README.md.
func TestOperatorProvidedObjectsDocumented(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(readme)
	for name, keys := range operatorSecrets {
		at := strings.Index(doc, "kubectl create secret generic "+name)
		if at < 0 {
			t.Errorf("deploy/README.md does not create Secret %s (`kubectl create secret generic %s ...`)", name, name)
			continue
		}
		cmd, _, _ := strings.Cut(doc[at:], "\n\n")
		for _, k := range keys {
			if !strings.Contains(cmd, "--from-literal="+k+"=") && !strings.Contains(cmd, "--from-file="+k+"=") {
				t.Errorf("deploy/README.md: Secret %s is created without key %s", name, k)
			}
		}
	}
	for _, c := range operatorClaims {
		if !strings.Contains(doc, "PersistentVolumeClaim `"+c+"`") {
			t.Errorf("deploy/README.md does not describe PersistentVolumeClaim `%s`", c)
		}
	}
}

// TestPdplaneContainers checks every pdplane container's command line and
// environment against what the built binary accepts, and the hardening
// every pdplane container gets.
func TestPdplaneContainers(t *testing.T) {
	t.Parallel()
	m := loadManifests(t)
	cmds := map[string]command{"serve": helpFlags(t, "serve"), "agent": helpFlags(t, "agent")}
	// The image's own PDPLANE_* variables override a config file too.
	_, image := loadTarget(t, controlplaneTarget)
	imageEnv := image.env(t)
	found := map[string]int{}
	for _, pt := range m.pods {
		for _, c := range pt.spec.Containers {
			if !isPdplane(&c) {
				continue
			}
			where := pt.owner + " container " + c.Name
			if len(c.Command) != 0 {
				t.Errorf("%s: command %q overrides the image's entrypoint (pdplane)", where, c.Command)
			}
			if len(c.Args) == 0 {
				t.Errorf("%s: no subcommand", where)
				continue
			}
			cmd, ok := cmds[c.Args[0]]
			if !ok {
				t.Errorf("%s: subcommand %q, want serve or agent", where, c.Args[0])
				continue
			}
			found[cmd.name]++
			set, err := parseArgs(cmd, c.Args[1:])
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			env := map[string]corev1.EnvVar{}
			for _, e := range c.Env {
				env[e.Name] = e
				if !strings.HasPrefix(e.Name, "PDPLANE_") {
					continue
				}
				flag, ok := cmd.envs[e.Name]
				if !ok {
					t.Errorf("%s: $%s is not a variable of `pdplane %s -h`", where, e.Name, cmd.name)
				} else if _, both := set[flag]; both {
					t.Errorf("%s: --%s is set both as a flag and as $%s", where, flag, e.Name)
				}
			}
			// $(VAR) in args expands only from the container's own env.
			for _, a := range c.Args {
				for _, ref := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(a, -1) {
					if _, ok := env[ref[1]]; !ok {
						t.Errorf("%s: argument %q refers to $(%s), which the container's env does not define", where, a, ref[1])
					}
				}
			}
			set = withConfigMap(t, m, pt, &c, cmd.name, set, env, imageEnv)
			checkHardened(t, where, pt.spec, &c)
			switch cmd.name {
			case "serve":
				checkServe(t, m, pt, &c, set, env)
			case "agent":
				checkAgent(t, m, pt, &c, set, env)
			}
		}
	}
	if found["serve"] == 0 || found["agent"] == 0 {
		t.Errorf("pdplane containers found: %v, want serve and agent", found)
	}
}

// withConfigMap checks a pdplane container's --config: a file of a
// generated ConfigMap mounted in the container, which the built binary
// accepts, with no secret, no $(VAR) (Kubernetes expands those only in args
// and env) and no key that args or a variable, the container's or the
// image's, overrides. It returns the flags the command sees as set: args
// over the file's keys.
func withConfigMap(t *testing.T, m *manifests, pt podTemplate, c *corev1.Container, sub string, set map[string]string,
	env map[string]corev1.EnvVar, imageEnv map[string]string) map[string]string {
	t.Helper()
	where := pt.owner + " container " + c.Name
	conf, ok := set["config"]
	if !ok {
		t.Errorf("%s: no --config: the settings belong in a config file (config/%s.yaml, a generated ConfigMap)", where, sub)
		return set
	}
	var file string
	for _, vm := range c.VolumeMounts {
		key, ok := strings.CutPrefix(conf, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok {
			continue
		}
		i := slices.IndexFunc(pt.spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i < 0 || pt.spec.Volumes[i].ConfigMap == nil || len(pt.spec.Volumes[i].ConfigMap.Items) > 0 || vm.SubPath != "" {
			t.Errorf("%s: --config %s: mount %s is not a whole ConfigMap", where, conf, vm.Name)
			return set
		}
		if file = m.configMaps[pt.spec.Volumes[i].ConfigMap.Name][key]; file == "" {
			t.Errorf("%s: --config %s: ConfigMap %s has no key %q", where, conf, pt.spec.Volumes[i].ConfigMap.Name, key)
			return set
		}
	}
	if file == "" {
		t.Errorf("%s: --config %s: no ConfigMap is mounted there", where, conf)
		return set
	}
	vars := map[string]string{}
	for k := range imageEnv {
		vars[k] = "image"
	}
	for k := range env {
		vars[k] = "container"
	}
	keys := configFileFlags(t, where, sub, file, set, vars)
	for k, v := range keys {
		if strings.Contains(v, "$(") {
			t.Errorf("%s: %s: %s: %q is not expanded in a file: give it as an argument", where, file, k, v)
		}
	}
	return withConfig(keys, set)
}

func checkHardened(t *testing.T, where string, pod *corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("%s: no securityContext", where)
		return
	}
	nonRoot := sc.RunAsNonRoot
	if nonRoot == nil && pod.SecurityContext != nil {
		nonRoot = pod.SecurityContext.RunAsNonRoot
	}
	if nonRoot == nil || !*nonRoot {
		t.Errorf("%s: runAsNonRoot is not true", where)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: readOnlyRootFilesystem is not true", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: privileged", where)
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) != 0 {
		t.Errorf("%s: capabilities must drop ALL and add none", where)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("%s: no cpu and memory requests", where)
	}
}

// controlPlaneAddr is serve's --addr: port of the container.
func checkServe(t *testing.T, m *manifests, pt podTemplate, c *corev1.Container, set map[string]string, env map[string]corev1.EnvVar) {
	t.Helper()
	where := pt.owner + " container " + c.Name
	if d, ok := m.deployments[strings.TrimPrefix(pt.owner, "Deployment ")]; !ok || d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("%s: serve runs as a Deployment of 2 or more replicas", where)
	}
	_, port, err := net.SplitHostPort(set["addr"])
	if err != nil {
		t.Errorf("%s: --addr %q: %v", where, set["addr"], err)
	} else if n, _ := strconv.Atoi(port); !hasPort(c, intstr.FromInt(n)) {
		t.Errorf("%s: --addr port %s is not a container port", where, port)
	}
	for _, v := range []string{"PDPLANE_DATABASE_URL", "PDPLANE_JOIN_TOKEN", "PDPLANE_ADMIN_TOKEN"} {
		if e, ok := env[v]; !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s: $%s must come from a Secret (secretKeyRef)", where, v)
		}
	}
	// Go's soft memory limit must sit below the container's hard one, or
	// the pod is killed before the collector works harder.
	if e, ok := env["GOMEMLIMIT"]; ok {
		limit, hasLimit := c.Resources.Limits[corev1.ResourceMemory]
		soft, err := goMemLimit(e.Value)
		switch {
		case err != nil:
			t.Errorf("%s: $GOMEMLIMIT %q: %v", where, e.Value, err)
		case !hasLimit:
			t.Errorf("%s: $GOMEMLIMIT is set without limits.memory", where)
		case soft >= limit.Value() || soft < limit.Value()*3/4:
			t.Errorf("%s: $GOMEMLIMIT %q is %d bytes; want 75-99 %% of limits.memory (%d bytes)", where, e.Value, soft, limit.Value())
		}
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("%s: liveness probe must be GET /healthz", where)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: readiness probe must be GET /readyz", where)
	}
	checkServeAnswersProbes(t, where, c)
}

// goMemLimit parses a GOMEMLIMIT value as the runtime does: a number of
// bytes with an optional unit B, KiB, MiB, GiB or TiB.
func goMemLimit(v string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}
	shift := uint(0)
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, shift = n, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("not a number of bytes with a unit")
	}
	return n << shift, nil
}

// checkServeAnswersProbes runs the built binary's serve (embedded store, on
// loopback) and asks it each probe path: the liveness path must answer 200,
// the readiness path must exist (503 is expected here: no pair is routable).
func checkServeAnswersProbes(t *testing.T, where string, c *corev1.Container) {
	t.Helper()
	base, stop := startPdplane(t, "/healthz", func(int) bool { return true }, 30*time.Second, "serve")
	defer stop()
	get := func(path string) (int, error) {
		client := http.Client{Timeout: 2 * time.Second}
		resp, err := client.Get(base + (&url.URL{Path: path}).String())
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(c.LivenessProbe.HTTPGet.Path); err != nil || code != http.StatusOK {
		t.Errorf("%s: liveness probe GET %s: %d, %v; want 200", where, c.LivenessProbe.HTTPGet.Path, code, err)
	}
	if code, err := get(c.ReadinessProbe.HTTPGet.Path); err != nil || (code != http.StatusOK && code != http.StatusServiceUnavailable) {
		t.Errorf("%s: readiness probe GET %s: %d, %v; want 200 or 503", where, c.ReadinessProbe.HTTPGet.Path, code, err)
	}
}

func checkAgent(t *testing.T, m *manifests, pt podTemplate, c *corev1.Container, set map[string]string, env map[string]corev1.EnvVar) {
	t.Helper()
	where := pt.owner + " container " + c.Name
	if e, ok := env["PDPLANE_JOIN_TOKEN"]; !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
		e.ValueFrom.SecretKeyRef.Name != "pdplane-tokens" || e.ValueFrom.SecretKeyRef.Key != "join-token" {
		t.Errorf("%s: $PDPLANE_JOIN_TOKEN must come from Secret pdplane-tokens key join-token, as serve's does", where)
	}

	// --control-plane: every URL names a declared headless Service that
	// publishes not-ready addresses, so the agent fails over address by
	// address and reaches replicas that are not ready yet.
	for _, raw := range strings.Split(set["control-plane"], ",") {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != "http" && u.Scheme != "https" {
			t.Errorf("%s: --control-plane %q is not an http(s) URL", where, raw)
			continue
		}
		svcName, _, _ := strings.Cut(u.Hostname(), ".")
		svc, ok := m.services[svcName]
		if !ok {
			t.Errorf("%s: --control-plane %s: no Service %q", where, raw, svcName)
			continue
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("%s: --control-plane Service %s must be headless with publishNotReadyAddresses", where, svcName)
		}
		port, _ := strconv.Atoi(u.Port())
		if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return int(p.Port) == port }) {
			t.Errorf("%s: --control-plane %s: Service %s has no port %d", where, raw, svcName, port)
		}
		if !slices.ContainsFunc(m.pods, func(p podTemplate) bool {
			return selects(svc.Spec.Selector, p.labels) && slices.ContainsFunc(p.spec.Containers, func(c corev1.Container) bool {
				return isPdplane(&c) && len(c.Args) > 0 && c.Args[0] == "serve"
			})
		}) {
			t.Errorf("%s: --control-plane Service %s selects no serve pod", where, svcName)
		}
	}

	// --engine-url: the pod IP (reachable from every replica) and a port
	// of a sibling engine container.
	u, err := url.Parse(set["engine-url"])
	if err != nil || u.Hostname() != "$(POD_IP)" {
		t.Errorf("%s: --engine-url %q: want http://$(POD_IP):PORT, the address routers reach", where, set["engine-url"])
	} else {
		port, _ := strconv.Atoi(u.Port())
		if !slices.ContainsFunc(pt.spec.Containers, func(s corev1.Container) bool { return s.Name != c.Name && hasPort(&s, intstr.FromInt(port)) }) {
			t.Errorf("%s: --engine-url port %d is no port of the engine container", where, port)
		}
	}
	for _, f := range []struct{ env, path string }{{"POD_IP", "status.podIP"}, {"POD_NAME", "metadata.name"}} {
		if e, ok := env[f.env]; ok && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != f.path) {
			t.Errorf("%s: $%s must come from the downward API (%s)", where, f.env, f.path)
		}
	}

	heal, ok := set["heal"]
	if !ok {
		t.Errorf("%s: no --heal: a decode with a bad NIXL agent is healed only by a restart", where)
		return
	}
	if err := checkHeal(heal); err != nil {
		t.Errorf("%s: %v", where, err)
	}
	if heal == "kubernetes" {
		checkKubernetesHeal(t, m, pt, where, env, set)
	}
}

// checkKubernetesHeal: --heal kubernetes deletes the agent's own pod
// through the in-cluster API, named by $POD_NAME, in the namespace of its
// service account's mounted files.
func checkKubernetesHeal(t *testing.T, m *manifests, pt podTemplate, where string, env map[string]corev1.EnvVar, set map[string]string) {
	t.Helper()
	if _, ok := env["POD_NAME"]; !ok {
		t.Errorf("%s: --heal kubernetes reads $POD_NAME: set it from the downward API (metadata.name)", where)
	}
	if _, ok := m.statefulSets[strings.TrimPrefix(pt.owner, "StatefulSet ")]; !ok || set["name"] != "$(POD_NAME)" {
		t.Errorf("%s: --heal kubernetes deletes the pod: run it in a StatefulSet with --name=$(POD_NAME), so the peer keeps its name", where)
	}
	if a := pt.spec.AutomountServiceAccountToken; a != nil && !*a {
		t.Errorf("%s: --heal kubernetes needs the service account token mounted", where)
	}
	sa := m.serviceAccounts[pt.spec.ServiceAccountName]
	if sa != nil && sa.AutomountServiceAccountToken != nil && !*sa.AutomountServiceAccountToken && pt.spec.AutomountServiceAccountToken == nil {
		t.Errorf("%s: ServiceAccount %s does not mount its token, which --heal kubernetes needs", where, sa.Name)
	}
	var verbs []string
	for _, rb := range m.roleBindings {
		if !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == pt.spec.ServiceAccountName
		}) {
			continue
		}
		role, ok := m.roles[rb.RoleRef.Name]
		if !ok {
			continue
		}
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "pods") {
				verbs = append(verbs, r.Verbs...)
			}
		}
	}
	for _, v := range []string{"get", "delete"} {
		if !slices.Contains(verbs, v) {
			t.Errorf("%s: --heal kubernetes: ServiceAccount %q may not %s pods (no RoleBinding to a Role granting it)", where, pt.spec.ServiceAccountName, v)
		}
	}
}

// TestEngineContainers: every container, engine included, asks for
// resources and may not escalate privileges.
func TestEngineContainers(t *testing.T) {
	t.Parallel()
	m := loadManifests(t)
	for _, pt := range m.pods {
		for _, c := range pt.spec.Containers {
			where := pt.owner + " container " + c.Name
			if len(c.Resources.Requests) == 0 {
				t.Errorf("%s: no resource requests", where)
			}
			if c.SecurityContext == nil || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation is not false", where)
			}
		}
	}
}

// TestEnginePodsDrainBeforeStopping: a pod with a pdplane agent drains its
// peer before it stops. The agent's preStop is `pdplane peers drain self
// --wait` with its own credential, a command line the binary accepts (run
// here with -h appended: an unknown flag would fail it); every other
// container of the pod waits in a preStop of its own; the grace period
// outlasts the drain's --timeout.
func TestEnginePodsDrainBeforeStopping(t *testing.T) {
	t.Parallel()
	m := loadManifests(t)
	agents := 0
	for _, pt := range m.pods {
		var agent *corev1.Container
		for i, c := range pt.spec.Containers {
			if isPdplane(&c) && len(c.Args) > 0 && c.Args[0] == "agent" {
				agent = &pt.spec.Containers[i]
			}
		}
		if agent == nil {
			continue
		}
		agents++
		if agent.Lifecycle == nil || agent.Lifecycle.PreStop == nil || agent.Lifecycle.PreStop.Exec == nil {
			t.Errorf("%s: the agent has no preStop exec", pt.owner)
			continue
		}
		cmd := agent.Lifecycle.PreStop.Exec.Command
		if len(cmd) < 5 || cmd[0] != "/usr/local/bin/pdplane" || strings.Join(cmd[1:5], " ") != "peers drain self --wait" {
			t.Errorf("%s: the agent's preStop is %q, want /usr/local/bin/pdplane peers drain self --wait ...", pt.owner, cmd)
			continue
		}
		if out, err := exec.Command(pdplaneBin, append(cmd[1:], "-h")...).CombinedOutput(); err != nil {
			t.Errorf("%s: the agent's preStop is no command pdplane accepts: %v\n%s", pt.owner, err, out)
		}
		var timeout time.Duration
		for _, a := range cmd {
			if v, ok := strings.CutPrefix(a, "--timeout="); ok {
				timeout, _ = time.ParseDuration(v)
			}
		}
		if g := pt.spec.TerminationGracePeriodSeconds; timeout == 0 || g == nil || time.Duration(*g)*time.Second <= timeout {
			t.Errorf("%s: the drain's --timeout %v does not end within the grace period %v", pt.owner, timeout, g)
		}
		for _, c := range pt.spec.Containers {
			if c.Name != agent.Name && (c.Lifecycle == nil || c.Lifecycle.PreStop == nil) {
				t.Errorf("%s: container %s stops without waiting for the drain", pt.owner, c.Name)
			}
		}
	}
	if agents == 0 {
		t.Fatal("no pod with a pdplane agent")
	}
}
