// Package cri reads the container runtime's pod sandboxes through its CRI
// socket (--cri-socket; containerd's /run/containerd/containerd.sock,
// CRI-O's /var/run/crio/crio.sock), read-only: one ListPodSandbox call
// (k8s.io/cri-api v1, the version the kubelet v1.34 speaks), under a
// timeout. Nothing here creates, stops or removes a sandbox.
package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultTimeout bounds one ListPodSandbox (the kubelet's own default
// runtime request timeout is 2 minutes; a read-only list answers in
// milliseconds on a healthy runtime).
const DefaultTimeout = 10 * time.Second

// maxMessage bounds the answer (a node's sandboxes: a few hundred bytes
// each; 16 MiB is the kubelet's own receive limit).
const maxMessage = 16 << 20

// Sandbox is one pod sandbox the runtime knows, in any state.
type Sandbox struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Ready     bool   `json:"ready"`
}

// Interface lists the runtime's sandboxes. Implementations are
// goroutine-safe.
type Interface interface {
	// ListPodSandboxes returns every sandbox the runtime has (ready and
	// not ready).
	ListPodSandboxes(ctx context.Context) ([]Sandbox, error)
	// Endpoint names the socket.
	Endpoint() string
}

// Client is the real Interface over a unix socket.
type Client struct {
	socket  string
	timeout time.Duration
}

var _ Interface = (*Client)(nil)

// New returns a client of the CRI socket at path (a "unix://" prefix is
// accepted). timeout <= 0 is DefaultTimeout. Nothing is dialled yet.
func New(path string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Client{socket: strings.TrimPrefix(path, "unix://"), timeout: timeout}
}

// Endpoint implements Interface.
func (c *Client) Endpoint() string { return c.socket }

// ErrNoSocket says the socket does not exist (the runtime is not there,
// or the path is not mounted into the daemon).
var ErrNoSocket = errors.New("no CRI socket")

// ListPodSandboxes implements Interface: one connection per call, closed
// after it.
func (c *Client) ListPodSandboxes(ctx context.Context) ([]Sandbox, error) {
	st, err := os.Stat(c.socket)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrNoSocket, c.socket, err)
	}
	if st.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("%w: %s is not a socket (%s)", ErrNoSocket, c.socket, st.Mode().Type())
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	conn, err := grpc.NewClient("passthrough:///"+c.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.socket)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return nil, fmt.Errorf("CRI client for %s: %w", c.socket, err)
	}
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox on %s: %w", c.socket, err)
	}
	out := make([]Sandbox, 0, len(resp.Items))
	for _, s := range resp.Items {
		sb := Sandbox{ID: s.Id, Ready: s.State == runtimeapi.PodSandboxState_SANDBOX_READY}
		if m := s.Metadata; m != nil {
			sb.Namespace, sb.Name, sb.UID = m.Namespace, m.Name, m.Uid
		}
		out = append(out, sb)
	}
	return out, nil
}
