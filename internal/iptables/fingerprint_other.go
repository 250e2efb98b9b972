//go:build !linux

package iptables

import "errors"

type fingerprint struct {
	info, sum   uint64
	full, empty bool
}

func (r *Real) fingerprint(Family, Backend, bool) (fingerprint, error) {
	return fingerprint{}, errors.New("fingerprints need Linux")
}
