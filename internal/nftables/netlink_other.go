//go:build !linux

package nftables

import (
	"context"
	"errors"
	"time"
)

// setMeta is only used by the Linux netlink reader.
type setMeta struct{}

// listNetlink: there is no nf_tables outside Linux.
func listNetlink(context.Context, string, time.Time, int, Family, string, *anonCache) (*Ruleset, int64, error) {
	return nil, 0, errors.New("nf_tables netlink is Linux only")
}
