//go:build !linux

package nftables

import "errors"

// generation is Linux only: elsewhere every listing runs nft.
func generation(string) (uint64, error) { return 0, errors.New("nf_tables generation: Linux only") }
