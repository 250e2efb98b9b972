package causes

import (
	"strings"
	"testing"
	"time"
)

func TestRankLogCauses(t *testing.T) {
	w := 5 * time.Minute
	r := Rank(Inputs{Logs: []LogLine{
		{Source: "kube-proxy pod kube-system/kp container kube-proxy", Class: ClassXtablesLock, Quote: "Another app is currently holding the xtables lock.", Count: 2, Window: w},
		{Source: "kube-proxy pod kube-system/kp container kube-proxy", Class: ClassMissingMatch, Object: "nfacct",
			Quote: "iptables-restore v1.8.9 (nf_tables): Couldn't load match `nfacct':No such file or directory", Count: 3, Window: w,
			Kernel: "xt_nfacct: missing (config.gz: CONFIG_NETFILTER_XT_MATCH_NFACCT is not set)", KernelLacks: true},
	}})
	if len(r.Likely) != 2 {
		t.Fatalf("likely %+v", r.Likely)
	}
	top := r.Likely[0]
	if top.Kind != LogMissingExtension || !strings.Contains(top.Summary, "Couldn't load match `nfacct'") || !strings.Contains(top.Summary, "lacks it") {
		t.Errorf("top %+v: want the missing extension the kernel lacks, quoting the line", top)
	}
	lock := r.Likely[1]
	if lock.Kind != LogXtablesLock || lock.Score != 2 || !strings.Contains(lock.Summary, "holding the xtables lock") {
		t.Errorf("lock %+v: 0.4/min is under the guide's rate, but a lock line still explains the failure", lock)
	}
	r = Rank(Inputs{Logs: []LogLine{{Source: "s", Class: ClassXtablesLock, Quote: "q", Count: 20, Window: w}}})
	if r.Likely[0].Score != 4 {
		t.Errorf("20 lines in 5 min: score %v, want 4 (4/min over field guide 3's 1/min)", r.Likely[0].Score)
	}
	r = Rank(Inputs{Logs: []LogLine{{Source: "s", Class: ClassMissingChain, Object: "KUBE-SVC-X", Quote: "q", Count: 1, Window: w}}})
	if r.Likely[0].Kind != LogMissingChain {
		t.Errorf("%+v", r.Likely)
	}
}
