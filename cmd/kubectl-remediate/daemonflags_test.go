package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// manifestArgs are the remediate container's arguments in a DaemonSet
// manifest (a chart template's are taken as written).
func manifestArgs(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- (--[a-z-]+(=.*)?)$`).FindAllStringSubmatch(string(b), -1) {
		args = append(args, strings.TrimSpace(m[1]))
	}
	if len(args) < 8 {
		t.Fatalf("%s: %d container arguments found; the pattern no longer matches the manifest", file, len(args))
	}
	return args
}

// TestDaemonFlagsCoverTheChart: every argument the chart's and
// kustomize's DaemonSet give the daemon is taken over by the one-shot run,
// but the few it sets itself or that only shape the daemon (oneShotFlags,
// never a path), or `kubectl remediate` judges the node with the pod's
// defaults instead of the mounts (HostLocalIPAM read no store:
// --cni-ipam-dir was missing from the list copied before).
func TestDaemonFlagsCoverTheChart(t *testing.T) {
	for _, file := range []string{"../../deploy/helm/remediate/templates/daemonset.yaml", "../../deploy/base/daemonset.yaml"} {
		args := manifestArgs(t, file)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "remediate-x", Namespace: "remediate"},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "remediate", Args: args}}}}
		argv, err := onceCommand(pod, &options{ctr: "remediate", output: "text"}, "node1", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		carried := 0
		for _, a := range args {
			name, value, _ := strings.Cut(a, "=")
			// A path (a mount) is always taken over, whatever
			// oneShotFlags says.
			if _, own := oneShotFlags[name]; own && !strings.HasPrefix(value, "/") {
				if name != "--node-name" && slices.Contains(argv, a) {
					t.Errorf("%s: %s is the one-shot run's own, taken over from the daemon: %q", file, a, argv)
				}
				continue
			}
			carried++
			if !slices.Contains(argv, a) {
				t.Errorf("%s gives the daemon %s; the one-shot run does not take it over: %q", file, a, argv)
			}
		}
		if carried < 5 {
			t.Errorf("%s: only %d arguments to take over", file, carried)
		}
	}
}

// TestOneShotFlagsAreTheDaemons: each flag the one-shot run keeps for
// itself is one of remediate's (a misspelt entry would carry the daemon's
// flag after all).
func TestOneShotFlagsAreTheDaemons(t *testing.T) {
	b, err := os.ReadFile("../../cmd/remediate/cli.go")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`fs\.\w+Var(P?)\(&o\.\w+, "([a-z-]+)"(, "([a-z])")?`).FindAllStringSubmatch(string(b), -1) {
		defined["--"+m[2]] = true
		if m[4] != "" {
			defined["-"+m[4]] = true
		}
	}
	if len(defined) < 20 {
		t.Fatalf("%d flags read from cmd/remediate/cli.go: the pattern no longer matches", len(defined))
	}
	for f := range oneShotFlags {
		if !defined[f] {
			t.Errorf("oneShotFlags names %s, which remediate does not define", f)
		}
	}
}

// TestOnceCommandCarriesEveryDaemonFlag: the one-shot run takes the
// daemon's arguments from the pod's spec, whatever they are (a flag added
// to the daemon next year included), in their order; "--flag value" is
// written "--flag=value", $(VAR) is expanded from the container's env as
// the kubelet does, and the one-shot run's own flags are its own, in
// either form.
func TestOnceCommandCarriesEveryDaemonFlag(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "remediate-x", Namespace: "remediate"},
		Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{
			Name:    "remediate",
			Command: []string{"/bin/remediate", "--from-command=/x"},
			Args: []string{"--policy=/etc/remediate/policy.yaml", "--node-name=$(NODE_NAME)", "--a-flag-of-next-year=/host/y",
				"--separate", "/host/z", "--metrics-addr", "127.0.0.1:9808", "--log-format=json", "--a-bool", "--dry-run",
				"--dir=/host/$(POD_NAMESPACE)/$(UNKNOWN)", "--literal=$$(NODE_NAME)", "--derived=$(DERIVED)", "-o", "json", "--sample=0"},
			Env: []corev1.EnvVar{
				{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
				{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				{Name: "DERIVED", Value: "$(NODE_NAME)-x"},
			},
		}}},
	}
	argv, err := onceCommand(pod, &options{ctr: "remediate", output: "text", act: true}, "node1", "", []string{"--log-level=debug"})
	if err != nil {
		t.Fatal(err)
	}
	// The daemon runs with --dry-run: --act does not lift it.
	want := []string{"/bin/remediate", "--once", "--node-name=node1", "--from-command=/x", "--policy=/etc/remediate/policy.yaml",
		"--a-flag-of-next-year=/host/y", "--separate=/host/z", "--a-bool", "--dir=/host/remediate/$(UNKNOWN)",
		"--literal=$(NODE_NAME)", "--derived=node1-x", "--dry-run", "-o", "text", "--log-level=debug"}
	if !slices.Equal(argv, want) {
		t.Errorf("argv\n%q\nwant\n%q", argv, want)
	}
}

// TestActDoesNotLiftTheDaemonSetsDryRun: --act lets the one-shot run act
// only where the DaemonSet itself would; a DaemonSet run with --dry-run
// (the platform team's fleet-wide dry run, in any spelling the daemon
// takes, or one it would refuse) keeps the one-shot run dry.
func TestActDoesNotLiftTheDaemonSetsDryRun(t *testing.T) {
	for _, tc := range []struct {
		args []string
		act  bool
		dry  bool
	}{
		{nil, false, true},
		{nil, true, false},
		{[]string{"--dry-run"}, true, true},
		{[]string{"--dry-run=true"}, true, true},
		{[]string{"--dry-run=$(DRY)"}, true, true},
		{[]string{"--dry-run=false"}, true, false},
		{[]string{"--dry-run", "--dry-run=false"}, true, false},
		{[]string{"--dry-run=maybe"}, true, true},
		{[]string{"--dry-run=false"}, false, true},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "remediate",
			Command: []string{"/bin/remediate"}, Args: append([]string{"--policy=/p"}, tc.args...),
			Env: []corev1.EnvVar{{Name: "DRY", Value: "1"}}}}}}
		argv, err := onceCommand(pod, &options{ctr: "remediate", output: "json", act: tc.act}, "n1", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(argv, "--dry-run"); got != tc.dry {
			t.Errorf("daemon args %q, --act=%v: one-shot argv %q, dry run %v, want %v", tc.args, tc.act, argv, got, tc.dry)
		}
	}
}

// FuzzExpandEnv: whatever a pod's argument holds, its expansion ends (no
// panic), keeps a text without '$' as it is, and expands a known variable
// between any two texts without '$'.
func FuzzExpandEnv(f *testing.F) {
	for _, s := range []string{"", "$", "$$", "$(", "$()", "$(A)", "$$(A)", "x$(A)y$(B", "$(A)$(A)", "$((A))"} {
		f.Add(s, "pre", "post")
	}
	env := map[string]string{"A": "v$(A)", "": "empty"}
	f.Fuzz(func(t *testing.T, s, pre, post string) {
		_ = expandEnv(s, env)
		if !strings.Contains(s, "$") && expandEnv(s, env) != s {
			t.Fatalf("%q expanded to %q", s, expandEnv(s, env))
		}
		if !strings.Contains(pre+post, "$") {
			if got := expandEnv(pre+"$(A)"+post, env); got != pre+"v$(A)"+post {
				t.Fatalf("%q: %q", pre+"$(A)"+post, got)
			}
		}
	})
}
