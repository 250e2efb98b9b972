package ipvs

// Options configure the real adapter.
type Options struct {
	// ProcRoot is the procfs mount (--proc-root, default "/proc"). The
	// availability check looks for <ProcRoot>/net/ip_vs and the connection
	// table is read from <ProcRoot>/net/ip_vs_conn; both show the network
	// namespace of the reading process (a hostNetwork pod sees the host's).
	ProcRoot string
	// NetNSPath, when set, is the network namespace to program
	// ("/proc/1/ns/net", "/var/run/netns/x"); "" is the current one.
	NetNSPath string
}

func (o Options) procRoot() string {
	if o.ProcRoot == "" {
		return "/proc"
	}
	return o.ProcRoot
}
