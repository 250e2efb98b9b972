//go:build linux

package nftables

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
	nfnlSubsysNFTables = 10
	nftMsgGetGen       = 16
	nftaGenID          = 1
)

// generation reads the nf_tables ruleset generation (NFT_MSG_GETGEN) of
// the network namespace at netns ("": the caller's). The kernel bumps it
// on every committed nf_tables transaction in that namespace: a table,
// chain, rule, set or element added, changed or deleted by nft or any
// other netlink client. It is one netlink request, no lock, no command.
func generation(netns string) (uint64, error) {
	var gen uint32
	err := inNetNS(netns, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return fmt.Errorf("nfnetlink: %w", err)
		}
		defer c.Close()
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysNFTables<<8 | nftMsgGetGen), Flags: netlink.Request},
			Data:   []byte{unix.AF_UNSPEC, 0, 0, 0},
		})
		if err != nil {
			return fmt.Errorf("NFT_MSG_GETGEN: %w", err)
		}
		for _, m := range msgs {
			if len(m.Data) < 4 {
				continue
			}
			ad, err := netlink.NewAttributeDecoder(m.Data[4:])
			if err != nil {
				return fmt.Errorf("NFT_MSG_GETGEN reply: %w", err)
			}
			ad.ByteOrder = byteorder.BigEndian
			for ad.Next() {
				if ad.Type() == nftaGenID {
					gen = ad.Uint32()
					return nil
				}
			}
		}
		return errors.New("NFT_MSG_GETGEN: no generation in the reply")
	})
	return uint64(gen), err
}

// inNetNS runs fn on a locked OS thread in the network namespace at path
// ("" runs it in the caller's).
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	runtime.LockOSThread()
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
		// Leave the thread locked: the runtime ends it with this
		// goroutine instead of reusing it in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("setns back: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}
