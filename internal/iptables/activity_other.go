//go:build !linux

package iptables

// lockActivity is Linux-only; elsewhere nothing is known about the lock.
type lockActivity struct{}

func lockActivityFor(string) *lockActivity { return nil }

func (*lockActivity) generation() (uint64, bool) { return 0, false }
