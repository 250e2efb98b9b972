//go:build linux

package nftables

import "github.com/remediate-dev/remediate/internal/nfnetlink"

// generation reads the nf_tables ruleset generation (NFT_MSG_GETGEN) of
// the network namespace at netns ("": the caller's): one netlink request,
// no lock, no command.
func generation(netns string) (uint64, error) { return nfnetlink.ReadGeneration(netns) }
