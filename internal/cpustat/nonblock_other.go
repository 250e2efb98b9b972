//go:build !linux

package cpustat

const syscallNonblock = 0
