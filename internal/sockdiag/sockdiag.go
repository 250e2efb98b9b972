// Package sockdiag lists the TCP sockets listening in a network namespace
// through the kernel's sock_diag netlink interface (NETLINK_SOCK_DIAG,
// inet_diag: what ss uses), with what /proc/net/tcp{,6} does not say: the
// cgroup of the process that created each socket (INET_DIAG_CGROUP_ID,
// kernel 5.7+: the id, that is the inode number, of that process's cgroup
// on the unified hierarchy when it created the socket).
//
// Dumping the sockets of one's own network namespace needs no capability
// and no ptrace: a daemon with hostNetwork and without CAP_SYS_PTRACE can
// tell which cgroup serves a port even though it cannot read the server's
// descriptors (/proc/<pid>/fd).
//
// Bounds: one dump per address family, at most MaxSockets listening sockets
// in all (more is an error), each receive bounded by the context's deadline
// or DefaultTimeout, a receive buffer of 64 KiB.
package sockdiag

import (
	"net/netip"
	"time"
)

// DefaultTimeout bounds a dump when the context has no deadline.
const DefaultTimeout = 2 * time.Second

// MaxSockets bounds the listening sockets one Listeners call reads.
const MaxSockets = 1 << 16

// Listener is one listening TCP socket.
type Listener struct {
	// Addr is the local address and port.
	Addr netip.AddrPort
	// Inode is the socket's inode (as /proc/<pid>/fd links name it:
	// socket:[inode]); UID its owner's.
	Inode uint64
	UID   uint32
	// CgroupID is the id of the cgroup (on the unified hierarchy) of the
	// process that created the socket; HasCgroupID is false when the
	// kernel did not say (before 5.7, or built without socket cgroup
	// data).
	CgroupID    uint64
	HasCgroupID bool
}

// Options says where to dump.
type Options struct {
	// NetNS is a network namespace file (/var/run/netns/<name>,
	// /proc/<pid>/ns/net) whose sockets are dumped; "" dumps this
	// process's own namespace (the node's, with hostNetwork).
	NetNS string
}
