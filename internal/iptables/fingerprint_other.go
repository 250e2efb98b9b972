//go:build !linux

package iptables

import "errors"

type fingerprint struct {
	info, sum   uint64
	full, empty bool
}

func (r *Real) fingerprint(Family, Backend, bool, func(fingerprint) bool) (fingerprint, *decoded, error) {
	return fingerprint{}, nil, errors.New("fingerprints need Linux")
}
