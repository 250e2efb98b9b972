package iptables

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/netnstest"
)

// benchSave loads a 100k-rule nat table into a fresh namespace with the
// backend's restore and measures the backend's save run (what the detector
// pays each cycle), reporting the parse time of the same output as a
// fraction of it. Root only.
func benchSave(b *testing.B, be Backend) {
	ns := netnstest.New(b)
	restore := "iptables-" + string(be) + "-restore"
	netnstest.NeedCommands(b, restore, SaveCommand(IPv4, be))
	b.Setenv("XTABLES_LOCKFILE", b.TempDir()+"/xtables.lock")
	text := natTable(100000)
	start := time.Now()
	netnstest.Run(b, ns, text, restore, "-w", "5")
	b.Logf("%s of %d bytes took %v", restore, len(text), time.Since(start))
	r := New(Config{Prefix: netnstest.Prefix(ns), Timeout: 2 * time.Minute})
	var saveTotal time.Duration
	var snap *Snapshot
	b.ResetTimer()
	for b.Loop() {
		var err error
		snap, err = r.Save(context.Background(), IPv4, be)
		if err != nil {
			b.Fatal(err)
		}
		saveTotal += snap.Duration
	}
	b.StopTimer()
	if snap.Rules.Table("nat").Chain("KUBE-SERVICES") == nil || snap.Rules.RuleCount() < 100000 {
		b.Fatalf("save returned %d rules", snap.Rules.RuleCount())
	}
	// Parse time of the saved text, measured apart from the command run.
	saved := snap.Rules.String()
	const parses = 3
	ps := time.Now()
	for range parses {
		if _, err := ParseString(saved); err != nil {
			b.Fatal(err)
		}
	}
	parse := time.Since(ps) / parses
	save := saveTotal / time.Duration(b.N)
	b.ReportMetric(float64(save.Milliseconds()), "save-ms")
	b.ReportMetric(float64(parse.Milliseconds()), "parse-ms")
	b.ReportMetric(float64(parse)/float64(save), "parse/save")
}

// BenchmarkSaveLegacy100kNat: iptables-legacy-save of 100k nat rules.
func BenchmarkSaveLegacy100kNat(b *testing.B) { benchSave(b, Legacy) }

// BenchmarkSaveNFT100kNat: iptables-nft-save of 100k nat rules.
func BenchmarkSaveNFT100kNat(b *testing.B) { benchSave(b, NFT) }

// BenchmarkSaveUnchanged20kNat: what a cycle pays for the legacy rules of a
// loaded node (20k kube-proxy-shaped nat rules in a namespace) when they
// did not change since the last cycle, no iptables-legacy-save run and no
// parse in either case:
//   - lock-untouched: nobody opened the xtables lock file since the last
//     cycle, so only the table names and IPT_SO_GET_INFO are read;
//   - lock-touched: something opened and closed it (kube-proxy's periodic
//     sync does), so the entries are read and hashed too (GET_ENTRIES, the
//     copy iptables-legacy-save makes).
//
// full-ms is one full save + parse of the same table for comparison. Root
// only.
func BenchmarkSaveUnchanged20kNat(b *testing.B) {
	ns := netnstest.New(b)
	netnstest.NeedCommands(b, "iptables-legacy-restore", SaveCommand(IPv4, Legacy))
	lock := b.TempDir() + "/xtables.lock"
	b.Setenv("XTABLES_LOCKFILE", lock)
	netnstest.Run(b, ns, natTable(20000), "iptables-legacy-restore", "-w", "5")
	for _, touched := range []bool{false, true} {
		name := "lock-untouched"
		if touched {
			name = "lock-touched"
		}
		b.Run(name, func(b *testing.B) {
			r := New(Config{Prefix: netnstest.Prefix(ns), NetNS: "/var/run/netns/" + ns, Timeout: time.Minute,
				LockFile: lock, EntriesMaxAge: time.Hour})
			ctx := context.Background()
			start := time.Now()
			first, err := r.Save(ctx, IPv4, Legacy)
			if err != nil {
				b.Fatal(err)
			}
			full := time.Since(start)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for b.Loop() {
				if touched {
					f, err := os.Open(lock)
					if err != nil {
						b.Fatal(err)
					}
					f.Close()
				}
				s, err := r.Save(ctx, IPv4, Legacy)
				if err != nil {
					b.Fatal(err)
				}
				if !s.Reused || s.Rules != first.Rules {
					b.Fatal("saved again although nothing changed")
				}
			}
			b.StopTimer()
			var reads Reads
			for _, x := range r.Reads() {
				if x.Family == IPv4 && x.Backend == Legacy {
					reads = x
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(full.Milliseconds()), "full-ms")
			b.ReportMetric(float64(first.Rules.RuleCount()), "rules")
			b.ReportMetric(float64(reads.Entries-1)/float64(b.N), "entry-reads/op")
		})
	}
}

// cpuTime is this process's user+system CPU time (the kernel's copy of the
// table included): wall time on a shared machine is noise.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
