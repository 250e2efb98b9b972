package hostlocal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/remediate-dev/remediate/internal/cni"
)

func TestParseConfigRanges(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		sizes      []uint64
		str        string
		unknown    string
	}{
		{"bridge conflist, subnet only", `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.0.0/24"}]]}},{"type":"portmap"}]}`,
			[]uint64{253}, "10.244.0.1-10.244.0.254", ""},
		{"tiny range", `{"name":"tiny","type":"bridge","ipam":{"type":"host-local","subnet":"10.99.0.0/24","rangeStart":"10.99.0.2","rangeEnd":"10.99.0.3"}}`,
			[]uint64{2}, "10.99.0.2-10.99.0.3", ""},
		{"dual stack", `{"name":"ds","plugins":[{"type":"ptp","ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/30"}],[{"subnet":"fd00::/120"}]]}}]}`,
			[]uint64{1, 254}, "10.1.0.1-10.1.0.2", ""},
		{"huge v6", `{"name":"v6","plugins":[{"type":"ptp","ipam":{"type":"host-local","ranges":[[{"subnet":"fd00::/8"}]]}}]}`,
			[]uint64{^uint64(0)}, "", ""},
		{"flannel delegate", `{"name":"cbr0","plugins":[{"type":"flannel","delegate":{"ipam":{"type":"host-local","subnet":"10.244.3.0/24"}}}]}`,
			[]uint64{253}, "", ""},
		{"usePodCidr", `{"name":"kubenet","type":"bridge","ipam":{"type":"host-local","subnet":"usePodCidr"}}`, nil, "", "subnet \"usePodCidr\""},
	} {
		cs, err := ParseConfig([]byte(tc.conf))
		if err != nil || len(cs) != 1 {
			t.Errorf("%s: %v %v", tc.name, cs, err)
			continue
		}
		c := cs[0]
		if !strings.Contains(c.Unknown, tc.unknown) || (tc.unknown == "") != (c.Unknown == "") {
			t.Errorf("%s: unknown %q", tc.name, c.Unknown)
		}
		var sizes []uint64
		for _, s := range c.RangeSets {
			sizes = append(sizes, s.Size())
		}
		if fmt.Sprint(sizes) != fmt.Sprint(tc.sizes) {
			t.Errorf("%s: sizes %v, want %v", tc.name, sizes, tc.sizes)
		}
		if tc.str != "" && c.RangeSets[0].String() != tc.str {
			t.Errorf("%s: %s", tc.name, c.RangeSets[0])
		}
	}
	if cs, err := ParseConfig([]byte(`{"name":"x","plugins":[{"type":"calico","ipam":{"type":"calico-ipam"}}]}`)); err != nil || len(cs) != 0 {
		t.Errorf("calico-ipam: %v %v", cs, err)
	}
}

// hostLocalBin is Debian's containernetworking-plugins host-local.
func hostLocalBin(t *testing.T) string {
	for _, d := range []string{os.Getenv("REMEDIATE_CNI_BIN"), "/usr/lib/cni", "/opt/cni/bin"} {
		if d == "" {
			continue
		}
		if p := filepath.Join(d, "host-local"); exists(p) {
			return p
		}
	}
	t.Skip("no host-local plugin binary (apt-get install containernetworking-plugins, or REMEDIATE_CNI_BIN)")
	return ""
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// runHostLocal runs the real plugin as a runtime would (CNI_COMMAND ADD
// or DEL, the configuration on stdin) and returns its stdout.
func runHostLocal(t *testing.T, bin, cmd, conf, id string) ([]byte, error) {
	c := exec.Command(bin)
	c.Env = []string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + id, "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=eth0", "CNI_PATH=" + filepath.Dir(bin)}
	c.Stdin = strings.NewReader(conf)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	return out.Bytes(), err
}

// TestRealHostLocalStore: the real host-local plugin allocates from a
// two-address range into a test data directory; ReadNetwork reads its
// real on-disk format (the container IDs and ifname), the range is full,
// and the plugin's own exhaustion error classifies as IPAMExhausted.
func TestRealHostLocalStore(t *testing.T) {
	bin := hostLocalBin(t)
	data := t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"tiny","type":"bridge","ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.99.0.0/24","rangeStart":"10.99.0.2","rangeEnd":"10.99.0.3"}]]}}`, data)
	ids := []string{strings.Repeat("a", 64), strings.Repeat("b", 64)}
	for _, id := range ids {
		if out, err := runHostLocal(t, bin, "ADD", conf, id); err != nil {
			t.Fatalf("ADD %s: %v: %s", id[:12], err, out)
		}
	}
	out, err := runHostLocal(t, bin, "ADD", conf, strings.Repeat("c", 64))
	if err == nil {
		t.Fatalf("third ADD in a 2-address range succeeded: %s", out)
	}
	var cniErr struct {
		Msg string `json:"msg"`
	}
	_ = json.Unmarshal(out, &cniErr)
	if !strings.Contains(cniErr.Msg, "no IP addresses available in range set: 10.99.0.2-10.99.0.3") || cni.ClassifyFailure(cniErr.Msg) != cni.FailureIPAMExhausted {
		t.Errorf("the plugin's error %q (%s)", out, cni.ClassifyFailure(cniErr.Msg))
	}
	cs, err := ParseConfig([]byte(conf))
	if err != nil || len(cs) != 1 || cs[0].DataDir != data || cs[0].RangeSets[0].Size() != 2 {
		t.Fatalf("config %+v %v", cs, err)
	}
	n, err := ReadNetwork(data, "tiny", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Allocations) != 2 || n.Truncated || n.Unread != 0 || len(n.Other) != 0 {
		t.Fatalf("network %+v", n)
	}
	for i, a := range n.Allocations {
		if a.IP != netip.MustParseAddr(fmt.Sprintf("10.99.0.%d", i+2)) || a.ContainerID != ids[i] || a.IfName != "eth0" || a.Err != "" || a.ModTime.IsZero() {
			t.Errorf("allocation %+v", a)
		}
		if !cs[0].RangeSets[0].Contains(a.IP) {
			t.Errorf("%s not in range", a.IP)
		}
	}
	// DEL releases: the store shows it.
	if out, err := runHostLocal(t, bin, "DEL", conf, ids[0]); err != nil {
		t.Fatalf("DEL: %v %s", err, out)
	}
	if n, _ := ReadNetwork(data, "tiny", Limits{}); len(n.Allocations) != 1 || n.Allocations[0].ContainerID != ids[1] {
		t.Errorf("after DEL %+v", n.Allocations)
	}
}

// TestHostileStore: many entries, a huge file, a FIFO and a symlink named
// as addresses, a directory, junk: a bounded answer, never a hang.
func TestHostileStore(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(data, "net")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)), []byte(fmt.Sprintf("id%d\r\neth0", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "10.9.0.1"), bytes.Repeat([]byte("x"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "10.9.0.2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "10.9.0.3")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "10.9.0.4"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10.9.0.5"), []byte("id\x1b[31m\r\neth0"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"lock", "last_reserved_ip.0", "junk"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := ReadNetwork(data, "net", Limits{MaxEntries: 100000, MaxRead: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Allocations) != 304 || fmt.Sprint(n.Other) != "[10.9.0.4 junk]" || n.Truncated {
		t.Fatalf("%d allocations, other %v", len(n.Allocations), n.Other)
	}
	bad := map[string]string{}
	for _, a := range n.Allocations {
		if a.Err != "" {
			bad[a.IP.String()] = a.Err
		}
	}
	if len(bad) != 4 || !strings.Contains(bad["10.9.0.1"], "larger than allowed") || bad["10.9.0.2"] == "" || bad["10.9.0.3"] == "" || !strings.Contains(bad["10.9.0.5"], "not a container ID") {
		t.Errorf("bad %v", bad)
	}
	// The bounds: entries listed, files read.
	n, err = ReadNetwork(data, "net", Limits{MaxEntries: 100, MaxRead: 10})
	if err != nil || !n.Truncated || n.Entries != 100 || n.Unread != len(n.Allocations)-10 {
		t.Fatalf("bounded: entries %d truncated %v unread %d of %d: %v", n.Entries, n.Truncated, n.Unread, len(n.Allocations), err)
	}
	if _, err := ReadNetwork(data, "../etc", Limits{}); err == nil {
		t.Error("a network name with a slash was read")
	}
	if _, err := ReadNetwork(data, "absent", Limits{}); !IsNotExist(err) {
		t.Errorf("absent: %v", err)
	}
}

func FuzzParseAllocation(f *testing.F) {
	f.Add([]byte(strings.Repeat("a", 64) + "\r\neth0"))
	f.Add([]byte("abc"))
	f.Add([]byte("\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, ifn, err := ParseAllocation(b)
		if err == nil && (id == "" || len(id) > 256 || len(ifn) > 64 || strings.ContainsAny(id+ifn, " \r\n\t\x00")) {
			t.Fatalf("%q -> %q %q", b, id, ifn)
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"name":"k8s","plugins":[{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.0.0/24","rangeStart":"10.244.0.10","rangeEnd":"10.244.0.20","gateway":"10.244.0.1"}]]}}]}`))
	f.Add([]byte(`{"name":"t","type":"bridge","ipam":{"type":"host-local","subnet":"fd00::/64"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		cs, err := ParseConfig(b)
		if err != nil {
			return
		}
		for _, c := range cs {
			for _, s := range c.RangeSets {
				_ = s.Size()
				_ = s.String()
				for _, r := range s {
					if !r.Subnet.Contains(r.Start) || !r.Subnet.Contains(r.End) || r.End.Less(r.Start) {
						t.Fatalf("range %+v", r)
					}
				}
			}
		}
	})
}
