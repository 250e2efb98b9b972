//go:build !linux

package iptables

import "errors"

type fingerprint struct {
	sum   uint64
	empty bool
}

func (r *Real) fingerprint(Family, Backend) (fingerprint, error) {
	return fingerprint{}, errors.New("fingerprints need Linux")
}
