//go:build linux

// Package nfnetlink holds the netfilter netlink reads the iptables and
// nftables adapters share: entering a network namespace on a locked
// thread for a read, and the nf_tables ruleset generation (NFT_MSG_GETGEN),
// the kernel's change counter of every committed nf_tables transaction.
// Both are reads: no lock is taken, no command run, nothing written.
package nfnetlink

import (
	byteorder "encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nf_tables netlink constants (linux/netfilter/nf_tables.h, nfnetlink.h).
const (
	// SubsysNFTables is the nfnetlink subsystem of nf_tables.
	SubsysNFTables = 10
	msgGetGen      = 16
	attrGenID      = 1
)

// InNetNS runs fn on a locked OS thread in the network namespace at path
// ("" runs it in the caller's, still on a locked thread so that
// /proc/thread-self/net is the namespace the sockets see). A thread that
// cannot return to its own namespace stays locked: the runtime ends it
// with the goroutine instead of reusing it in the wrong namespace.
func InNetNS(path string, fn func() error) error {
	runtime.LockOSThread()
	if path == "" {
		defer runtime.UnlockOSThread()
		return fn()
	}
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("own network namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(path)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", path, err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, fmt.Errorf("setns back: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Generation reads the nf_tables ruleset generation over c, an open
// NETLINK_NETFILTER connection, in c's network namespace. The kernel bumps
// it on every committed nf_tables transaction there: a table, chain, rule,
// set or element added, changed or deleted by nft, iptables-nft or any
// other netlink client.
func Generation(c *netlink.Conn) (uint32, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(SubsysNFTables<<8 | msgGetGen), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, 0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("NFT_MSG_GETGEN: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("NFT_MSG_GETGEN reply: %w", err)
		}
		ad.ByteOrder = byteorder.BigEndian
		for ad.Next() {
			if ad.Type() == attrGenID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("NFT_MSG_GETGEN: no generation in the reply")
}

// ReadGeneration dials nfnetlink in the network namespace at netns ("":
// the caller's) and reads the nf_tables generation there.
func ReadGeneration(netns string) (uint64, error) {
	var gen uint32
	err := InNetNS(netns, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return fmt.Errorf("nfnetlink: %w", err)
		}
		defer c.Close()
		gen, err = Generation(c)
		return err
	})
	return uint64(gen), err
}
