package kmod

import (
	"compress/gzip"
	"io"
	"strings"
)

// maxConfig bounds the decompressed /proc/config.gz read (a distribution
// kernel's is about 300 KB).
const maxConfig = 4 << 20

// ConfigSymbols maps the netfilter modules kube-proxy needs to the kernel
// configuration symbol that builds each (Kconfig of net/netfilter,
// net/ipv4/netfilter, net/ipv6/netfilter): /proc/config.gz saying the
// symbol "is not set" means the kernel was built without it, a certain
// absence even when the host's module lists cannot be read.
var ConfigSymbols = map[string]string{
	"nf_conntrack":    "CONFIG_NF_CONNTRACK",
	"nf_nat":          "CONFIG_NF_NAT",
	"xt_conntrack":    "CONFIG_NETFILTER_XT_MATCH_CONNTRACK",
	"xt_comment":      "CONFIG_NETFILTER_XT_MATCH_COMMENT",
	"xt_mark":         "CONFIG_NETFILTER_XT_MARK",
	"xt_statistic":    "CONFIG_NETFILTER_XT_MATCH_STATISTIC",
	"xt_addrtype":     "CONFIG_NETFILTER_XT_MATCH_ADDRTYPE",
	"xt_nat":          "CONFIG_NETFILTER_XT_NAT",
	"xt_MASQUERADE":   "CONFIG_NETFILTER_XT_TARGET_MASQUERADE",
	"xt_nfacct":       "CONFIG_NETFILTER_XT_MATCH_NFACCT",
	"nfnetlink_acct":  "CONFIG_NETFILTER_NETLINK_ACCT",
	"ipt_REJECT":      "CONFIG_IP_NF_TARGET_REJECT",
	"ip6t_REJECT":     "CONFIG_IP6_NF_TARGET_REJECT",
	"ip_tables":       "CONFIG_IP_NF_IPTABLES",
	"ip6_tables":      "CONFIG_IP6_NF_IPTABLES",
	"iptable_nat":     "CONFIG_IP_NF_NAT",
	"ip6table_nat":    "CONFIG_IP6_NF_NAT",
	"iptable_filter":  "CONFIG_IP_NF_FILTER",
	"ip6table_filter": "CONFIG_IP6_NF_FILTER",
	"nf_tables":       "CONFIG_NF_TABLES",
	"nft_compat":      "CONFIG_NFT_COMPAT",
	"nft_chain_nat":   "CONFIG_NFT_NAT",
}

// ParseConfig parses a kernel configuration (the text of /proc/config.gz,
// decompressed) into its symbols' values: "y", "m", a string or number
// for a set symbol, "n" for "# CONFIG_X is not set".
func ParseConfig(r io.Reader) map[string]string {
	out := map[string]string{}
	lines(r, func(l string) {
		l = strings.TrimSpace(l)
		if rest, ok := strings.CutPrefix(l, "# "); ok {
			if sym, ok := strings.CutSuffix(rest, " is not set"); ok && validSymbol(sym) {
				out[sym] = "n"
			}
			return
		}
		sym, val, ok := strings.Cut(l, "=")
		if ok && validSymbol(sym) && len(val) < 256 {
			out[sym] = val
		}
	})
	return out
}

func validSymbol(s string) bool {
	if !strings.HasPrefix(s, "CONFIG_") || len(s) > 128 {
		return false
	}
	for _, c := range s[len("CONFIG_"):] {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return len(s) > len("CONFIG_")
}

// readConfig reads and decompresses a config.gz, bounded.
func readConfig(p string) (map[string]string, error) {
	var cfg map[string]string
	var gzErr error
	err := readFile(p, func(r io.Reader) {
		z, err := gzip.NewReader(r)
		if err != nil {
			gzErr = err
			return
		}
		defer z.Close()
		cfg = ParseConfig(io.LimitReader(z, maxConfig))
	})
	if err != nil {
		return nil, err
	}
	return cfg, gzErr
}

// configState is what the kernel configuration says of module, "" when it
// says nothing (no config.gz, or a module without a known symbol).
func (s *Snapshot) configState(module string) State {
	if s.Config == nil {
		return ""
	}
	sym, ok := ConfigSymbols[module]
	if !ok {
		return ""
	}
	switch v, set := s.Config[sym]; {
	case !set:
		// Not named at all: its dependencies were unset, or this kernel
		// version names the feature otherwise (symbols are renamed
		// across releases): no conclusion.
		return ""
	case v == "n":
		return Missing
	case v == "y":
		return Builtin
	}
	return ""
}
