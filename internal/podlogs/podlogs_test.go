package podlogs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Real lines: kube-proxy's klog output as the container runtime stores it
// (a klog err=< block is one line per CRI record). The restore errors are
// those quoted by kubernetes/kubernetes#142068, k3s-io/k3s#10099 and
// projectcalico/calico#10538; the lock lines are iptables 1.8's.
var realLines = []struct {
	line string
	want Class
}{
	{"2026-03-02T10:14:07.412345678Z stderr F \tiptables-restore v1.8.9 (nf_tables): Couldn't load match `nfacct':No such file or directory", Class{MissingMatch, "nfacct"}},
	{"2024-05-13T08:01:22.100000000Z stderr F \tiptables-restore v1.8.8 (legacy): Couldn't load target `REJECT':No such file or directory", Class{MissingTarget, "REJECT"}},
	{"2025-11-20T17:40:03.000000001Z stderr F \tiptables-restore v1.8.7 (nf_tables): Couldn't load target `KUBE-SVC-ERIFXISQEP7F7OF4':No such file or directory", Class{MissingChain, "KUBE-SVC-ERIFXISQEP7F7OF4"}},
	{"2026-11-29T06:30:00.123456789Z stderr F \tAnother app is currently holding the xtables lock. Stopped waiting after 5s.", Class{Kind: XtablesLock}},
	{"2026-11-29T06:30:00.123456789Z stderr F \tAnother app is currently holding the xtables lock; still 4s 900000us time ahead to have a chance to grab the lock...", Class{Kind: XtablesLock}},
	{"2026-11-29T06:30:00.1Z stderr F \tiptables-restore v1.8.9 (legacy): can't initialize iptables table `nat': Permission denied (you must be root)", Class{Kind: PermissionDenied}},
	{`2026-11-29T06:30:00Z stderr F W1129 06:30:00.000000       1 reflector.go:561] k8s.io/client-go/informers/factory.go:160: failed to list *v1.Service: Get "https://10.96.0.1:443/api/v1/services?labelSelector=%21service.kubernetes.io%2Fheadless&limit=500": dial tcp 10.96.0.1:443: connect: connection refused`, Class{Kind: APIRefused}},
	{`2026-11-29T06:30:00Z stderr F E1129 06:30:00.000000       1 reflector.go:158] "Unhandled Error" err="k8s.io/client-go/informers/factory.go:160: Failed to watch *v1.EndpointSlice: failed to list *v1.EndpointSlice: Unauthorized" logger="UnhandledError"`, Class{Kind: APIUnauthorized}},
	{`2026-11-29T06:30:00Z stderr F W1129 06:30:00.000000       1 reflector.go:561] k8s.io/client-go/informers/factory.go:160: failed to list *v1.EndpointSlice: endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:kube-system:kube-proxy" cannot list resource "endpointslices" in API group "discovery.k8s.io" at the cluster scope`, Class{Kind: APIForbidden}},
}

func TestClassifyRealLines(t *testing.T) {
	for _, c := range realLines {
		l, err := ParseLine([]byte(c.line))
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		got, ok := Classify(l.Text)
		if !ok || got != c.want {
			t.Errorf("Classify(%q) = %+v, %v; want %+v", l.Text, got, ok, c.want)
		}
	}
	for _, text := range []string{
		`I1129 06:30:00.000000       1 proxier.go:805] "SyncProxyRules complete" ipFamily="IPv4" elapsed="20.1ms"`,
		`I1129 06:30:00.000000       1 server.go:234] "Successfully retrieved NodeIPs" NodeIPs=["10.0.0.1"]`,
		`Error occurred at line: 14`,
		// The real kube-proxy v1.34.4 logs this at start in an unprivileged
		// container (TestE2EKubeProxyLogCauses): not netfilter's.
		`I1129 06:43:07.407348   30805 server.go:538] "Failed to apply OOMScore" err="write /proc/self/oom_score_adj: permission denied"`,
		"",
	} {
		if c, ok := Classify(text); ok {
			t.Errorf("Classify(%q) = %+v: a line of no known kind", text, c)
		}
	}
}

func TestParseLine(t *testing.T) {
	l, err := ParseLine([]byte("2026-11-29T06:30:00.123456789Z stdout P part one"))
	if err != nil || l.Stream != "stdout" || !l.Partial || l.Text != "part one" || l.Time.Nanosecond() != 123456789 {
		t.Fatalf("got %+v, %v", l, err)
	}
	for _, bad := range []string{"", "garbage", "2026-11-29T06:30:00Z stdin F x", "2026-11-29T06:30:00Z stdout X x", "notatime stdout F x"} {
		if _, err := ParseLine([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	lines, skipped := ParseLines([]byte("2026-11-29T06:30:00Z stderr P Another app is currently \n2026-11-29T06:30:00Z stderr F holding the xtables lock.\njunk\n"))
	if skipped != 1 || len(lines) != 1 || lines[0].Text != "Another app is currently holding the xtables lock." {
		t.Fatalf("partial join: %+v, skipped %d", lines, skipped)
	}
}

func FuzzParseLines(f *testing.F) {
	for _, c := range realLines {
		f.Add([]byte(c.line + "\n"))
	}
	f.Add([]byte("2026-11-29T06:30:00Z stdout P a\n2026-11-29T06:30:00Z stdout F b\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		lines, skipped := ParseLines(b)
		if skipped < 0 || len(lines) > len(b) {
			t.Fatalf("%d lines, %d skipped of %d bytes", len(lines), skipped, len(b))
		}
		for _, l := range lines {
			if len(l.Text) > maxLineText || (l.Stream != "stdout" && l.Stream != "stderr") {
				t.Fatalf("bad line %+v", l)
			}
			Classify(l.Text)
			if q := Quote(l.Text); strings.ContainsAny(q, "\x1b\n\r") {
				t.Fatalf("quote %q not terminal-safe", q)
			}
		}
	})
}

func TestQuoteRedactsAndEscapes(t *testing.T) {
	q := Quote("failed: --token=abcdef0123456789abcdef \x1b[31mred\x1b[0m " + strings.Repeat("x", 1000))
	if strings.Contains(q, "abcdef0123456789abcdef") || strings.Contains(q, "\x1b") || len(q) > maxQuote+64 {
		t.Fatalf("Quote = %q", q)
	}
}

func writeLog(t *testing.T, root string, s Source, n int, body string) string {
	t.Helper()
	dir := filepath.Join(root, s.Namespace+"_"+s.Pod+"_"+s.UID, s.Container)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, fmt.Sprintf("%d.log", n))
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDirTail(t *testing.T) {
	root := t.TempDir()
	s := Source{Namespace: "kube-system", Pod: "kube-proxy-abc", UID: "0b7e-uid", Container: "kube-proxy"}
	old := "2026-11-29T06:00:00Z stderr F \tiptables-restore v1.8.9 (nf_tables): Couldn't load match `nfacct':No such file or directory\n"
	writeLog(t, root, s, 0, old)
	var cur strings.Builder
	for i := 0; i < 5000; i++ { // ~300 KiB: only the tail is read
		fmt.Fprintf(&cur, "2026-11-29T06:%02d:%02dZ stderr F I1129 line %d\n", i/60%60, i%60, i)
	}
	cur.WriteString("2026-11-29T06:59:59Z stderr F \tAnother app is currently holding the xtables lock. Stopped waiting after 5s.\n")
	writeLog(t, root, s, 1, cur.String())
	writeLog(t, root, s, 2, "") // empty newest run
	d := Dir{Root: root, TailBytes: 4 << 10, MaxFiles: 3}
	tail, err := d.Tail(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if len(tail.Files) != 3 || !strings.HasSuffix(tail.Files[0], "2.log") {
		t.Fatalf("files %v", tail.Files)
	}
	if len(tail.Lines) == 0 || len(tail.Lines) > 100 {
		t.Fatalf("%d lines: the tail bound was not kept", len(tail.Lines))
	}
	if first := tail.Lines[0]; !strings.Contains(first.Text, "nfacct") {
		t.Errorf("oldest line %q: want the previous run's", first.Text)
	}
	if last := tail.Lines[len(tail.Lines)-1]; !strings.Contains(last.Text, "xtables lock") {
		t.Errorf("newest line %q", last.Text)
	}
	if tail.Skipped != 0 {
		t.Errorf("skipped %d: the cut first line must be dropped, not parsed", tail.Skipped)
	}
	// Two files by default.
	if tail, err := (Dir{Root: root}).Tail(context.Background(), s); err != nil || len(tail.Files) != 2 {
		t.Fatalf("default MaxFiles: %v %v", tail.Files, err)
	}
}

func TestDirRefusesLinksFIFOsAndBadNames(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	s := Source{Namespace: "kube-system", Pod: "kube-proxy-abc", UID: "u1", Container: "kube-proxy"}
	secret := writeLog(t, outside, s, 0, "2026-11-29T06:00:00Z stderr F secret outside\n")
	ctx := context.Background()

	// The pod directory a symlink out of the root.
	if err := os.Symlink(filepath.Join(outside, "kube-system_kube-proxy-abc_u1"), filepath.Join(root, "kube-system_kube-proxy-abc_u1")); err != nil {
		t.Fatal(err)
	}
	if _, err := (Dir{Root: root}).Tail(ctx, s); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("pod dir symlink: %v", err)
	}
	// The log file a symlink.
	root2 := t.TempDir()
	p := writeLog(t, root2, s, 0, "")
	os.Remove(p)
	if err := os.Symlink(secret, p); err != nil {
		t.Fatal(err)
	}
	if tail, err := (Dir{Root: root2}).Tail(ctx, s); err == nil {
		t.Errorf("log file symlink followed: %+v", tail)
	}
	// A FIFO as the log file: refused without blocking.
	root3 := t.TempDir()
	p = writeLog(t, root3, s, 0, "")
	os.Remove(p)
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := (Dir{Root: root3}).Tail(ctx, s); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("FIFO read")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("FIFO blocked the read")
	}
	for _, bad := range []Source{{"..", "p", "u", "c"}, {"ns", "a/b", "u", "c"}, {"ns", "p", "", "c"}} {
		if _, err := (Dir{Root: root}).Tail(ctx, bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if _, err := (Dir{Root: root}).Tail(ctx, Source{"ns", "p", "u", "c"}); !errors.Is(err, ErrNoLogs) {
		t.Errorf("absent pod: %v, want ErrNoLogs", err)
	}
}

func TestFake(t *testing.T) {
	var f Fake
	s := Source{"kube-system", "kp", "u", "kube-proxy"}
	if _, err := f.Tail(context.Background(), s); !errors.Is(err, ErrNoLogs) {
		t.Fatal(err)
	}
	f.MaxLines = 1
	f.Append(s, Line{Text: "a"}, Line{Text: "b"})
	tail, err := f.Tail(context.Background(), s)
	if err != nil || len(tail.Lines) != 1 || tail.Lines[0].Text != "b" || f.Reads() != 2 {
		t.Fatalf("%+v %v", tail, err)
	}
	f.SetError(s, errors.New("boom"))
	if _, err := f.Tail(context.Background(), s); err == nil {
		t.Fatal("error not returned")
	}
}

func TestSharedReadsOncePerMaxAge(t *testing.T) {
	f := &Fake{}
	s := Source{"kube-system", "kp", "u", "kube-proxy"}
	f.Append(s, Line{Text: "a"})
	now := time.Unix(1_800_000_000, 0)
	sh := &Shared{R: f, MaxAge: 2 * time.Second, Now: func() time.Time { return now }}
	for i := 0; i < 3; i++ {
		if tail, err := sh.Tail(context.Background(), s); err != nil || len(tail.Lines) != 1 {
			t.Fatalf("%+v %v", tail, err)
		}
	}
	if f.Reads() != 1 {
		t.Fatalf("%d reads within MaxAge, want 1", f.Reads())
	}
	now = now.Add(2 * time.Second)
	sh.Tail(context.Background(), s)
	if f.Reads() != 2 {
		t.Fatalf("%d reads after MaxAge, want 2", f.Reads())
	}
}

// BenchmarkDirTail: one source, two 1 MiB log files, the default bounds
// (64 KiB of each), parsed.
func BenchmarkDirTail(b *testing.B) {
	root := b.TempDir()
	s := Source{"kube-system", "kp", "u", "kube-proxy"}
	var body strings.Builder
	for body.Len() < 1<<20 {
		body.WriteString("2026-11-29T06:30:00.123456789Z stderr F I1129 06:30:00.123456       1 proxier.go:805] \"SyncProxyRules complete\" ipFamily=\"IPv4\" elapsed=\"20.1ms\"\n")
	}
	dir := filepath.Join(root, "kube-system_kp_u", "kube-proxy")
	os.MkdirAll(dir, 0o755)
	for _, n := range []string{"0.log", "1.log"} {
		os.WriteFile(filepath.Join(dir, n), []byte(body.String()), 0o644)
	}
	d := Dir{Root: root}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		tail, err := d.Tail(context.Background(), s)
		if err != nil || len(tail.Lines) == 0 {
			b.Fatal(err)
		}
		for _, l := range tail.Lines {
			Classify(l.Text)
		}
	}
}
