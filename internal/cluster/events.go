package cluster

import (
	"context"
	"time"
)

// Reasons of the kubelet's Events about a pod's sandbox (k8s.io/kubernetes
// pkg/kubelet/events): FailedCreatePodSandBox when the runtime (the CNI
// plugin, mostly) could not create it, FailedKillPod when stopping the pod
// failed (its message carries the KillPodSandbox error: a CNI DEL that
// failed).
const (
	ReasonFailedCreatePodSandBox = "FailedCreatePodSandBox"
	ReasonFailedKillPod          = "FailedKillPod"
)

// SandboxEvent is one kubelet Event about a pod's sandbox.
type SandboxEvent struct {
	// Reason is ReasonFailedCreatePodSandBox or ReasonFailedKillPod.
	Reason string `json:"reason"`
	// Message is the Event's message, clipped.
	Message string `json:"message"`
	// Count is how many times it happened (the Event's count, or its
	// series' count; at least 1).
	Count int `json:"count"`
	// Last is when it last happened (API server clock).
	Last time.Time `json:"last"`
	// Host is the node the kubelet that wrote it runs on (source.host, or
	// reportingInstance).
	Host string `json:"host,omitempty"`
}

// PodEvents reads the sandbox Events of this node's pods, one pod at a
// time (a bounded, field-selected list: never a cluster-wide watch).
// Implementations are goroutine-safe.
type PodEvents interface {
	// SandboxEvents returns the sandbox Events of pod (by UID, in its
	// namespace) written by this node's kubelet, at most max, newest
	// first.
	SandboxEvents(ctx context.Context, pod *Pod, max int) ([]SandboxEvent, error)
}
