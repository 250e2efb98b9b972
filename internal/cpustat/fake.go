package cpustat

import (
	"context"
	"fmt"
	"sync"
)

// Fake is a stateful Interface for tests: set what each pid's cgroup and
// the node show; the values change between calls as the test sets them.
type Fake struct {
	mu      sync.Mutex
	cgroups map[int32]CgroupCPU
	node    CPUTimes
	nodeErr error
	reads   int
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty fake (every pid unknown, node times zero).
func NewFake() *Fake { return &Fake{cgroups: map[int32]CgroupCPU{}} }

// SetCgroup sets what CgroupCPU(pid) returns.
func (f *Fake) SetCgroup(pid int32, c CgroupCPU) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cgroups[pid] = c
}

// SetNode sets what NodeCPU returns (err non-nil: that error).
func (f *Fake) SetNode(t CPUTimes, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.node, f.nodeErr = t, err
}

// Reads counts the calls made (for cost assertions).
func (f *Fake) Reads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// CgroupCPU implements Interface.
func (f *Fake) CgroupCPU(_ context.Context, pid int32) (CgroupCPU, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	c, ok := f.cgroups[pid]
	if !ok {
		return CgroupCPU{}, fmt.Errorf("no cgroup for pid %d", pid)
	}
	return c, nil
}

// NodeCPU implements Interface.
func (f *Fake) NodeCPU(context.Context) (CPUTimes, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.node, f.nodeErr
}

// RemoveCgroup makes CgroupCPU(pid) fail as for a process that exited.
func (f *Fake) RemoveCgroup(pid int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.cgroups, pid)
}
