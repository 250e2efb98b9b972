package finding

// Subject is what the engine's ordering and the paired action read of a
// finding's target, typed: its kind and the few facts they judge by. The
// detector fills it beside the Evidence; the Evidence stays a free-form
// map for people (the report, the journal, the Node), and nothing across
// the seam between detectors and actions reads it by key.
//
// It is not part of the report (the findings' JSON is unchanged): a
// finding is acted on in the cycle that made it, never read back.
type Subject struct {
	// Kind is the kind of the target. A detector whose type declares one
	// kind (detect.Targets) may leave it empty: the engine fills it in
	// from the declaration.
	Kind Kind
	// AgeSeconds is how long the target has been in the state judged: how
	// long a lock holder has held the xtables lock, how long a process has
	// run, how long a kube-proxy family's sync is overdue. The engine acts
	// on the oldest first; 0 when not known.
	AgeSeconds float64
	// Process holds the facts of a process target (KindProcess).
	Process *Process
	// Conntrack holds the facts of a dead backend's conntrack entries
	// (KindConntrackBackend).
	Conntrack *Conntrack
	// Agent holds the facts of a node agent target (KindNodeAgent).
	Agent *Agent
	// Refs are the typed references of the target, as the adapters that
	// own them define them (ipvs.RealRef, ipvs.VirtualRef,
	// conntrack.BackendRef, conntrack.TableRef): what an action acts on.
	// One target may carry several (a stale IPVS real server is also a
	// dead backend's conntrack entries). Read them with RefOf.
	Refs []Ref
	// Pod holds the facts of a pod target (KindPod) when its detector
	// knows them.
	Pod *Pod
}

// Pod is what an action on a pod target reads of it.
type Pod struct {
	// UID is the UID of the pod the detector judged: another UID now
	// means the pod was replaced since (same name: a StatefulSet's).
	UID string
}

// Ref is an adapter's typed reference to what a finding is about; the
// adapter defines it with its one encoding (target, evidence for people).
type Ref interface {
	// Kind is the kind of target the reference names.
	Kind() Kind
}

// RefOf returns the first reference of type T that s carries.
func RefOf[T Ref](s Subject) (T, bool) {
	for _, r := range s.Refs {
		if t, ok := r.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

// Process is what the ordering and KillProcess read of a process target
// (its identity is the target itself, procs.Ref).
type Process struct {
	// HoldsXtablesLock: the process holds the node's xtables lock.
	HoldsXtablesLock bool
	// WaitsOnXtablesLock: the process waits on the node's xtables lock.
	WaitsOnXtablesLock bool
	// HoldMeasured says HoldSeconds was measured: the finding is about a
	// lock holder from the detector that watches the lock
	// (XtablesLockContention). KillProcess applies its minHoldTime then.
	HoldMeasured bool
	// HoldSeconds is how long the process has held the xtables lock.
	HoldSeconds float64
	// ProgressChecked says the detector judged the process making no
	// progress: no CPU time used over ProgressWindowSeconds and not
	// running. CPUTicks is its CPU time (utime+stime, USER_HZ ticks) at
	// the detector's last read: KillProcess re-reads it before every
	// signal and refuses a process that used CPU since.
	ProgressChecked       bool
	CPUTicks              uint64
	ProgressWindowSeconds float64
	// MakingProgress says the detector saw the process use CPU over the
	// window (a lock holder at work): reported, never killed.
	MakingProgress bool
}

// Conntrack is what FlushConntrack reads of a dead backend's entries.
type Conntrack struct {
	// Entries is how many entries the detector counted this cycle (from
	// the same table the action deletes from); 0 when it did not count.
	Entries int
}

// Agent is what RestartNodeAgent reads of a node agent target.
type Agent struct {
	// PodUID is the UID of the agent's pod the detector judged ("" when
	// not known): another pod now means the agent was replaced since.
	PodUID string
	// Shape is how the node runs the agent, when the detector told it
	// from its process (procident.Shape: "DaemonSet pod", "static pod",
	// "systemd unit", "embedded", "host process"); RestartHow, for every
	// shape but a DaemonSet's pod, how an operator restarts it: deleting
	// a pod through the API cannot.
	Shape, RestartHow string
}

// CPUTicksOr0 is p.CPUTicks, 0 for a nil p.
func (p *Process) CPUTicksOr0() uint64 {
	if p == nil {
		return 0
	}
	return p.CPUTicks
}
