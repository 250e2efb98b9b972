package cri

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type runtimeServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	items []*runtimeapi.PodSandbox
	block chan struct{}
}

func (s *runtimeServer) ListPodSandbox(ctx context.Context, _ *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	if s.block != nil {
		select {
		case <-s.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: s.items}, nil
}

func serve(t *testing.T, srv *runtimeServer) string {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(g, srv)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	return sock
}

// TestListPodSandboxes: the CRI v1 ListPodSandbox over a real unix socket
// (a gRPC server of the cri-api's RuntimeService); a missing socket, a
// file that is not a socket and a runtime that does not answer are
// bounded errors.
func TestListPodSandboxes(t *testing.T) {
	srv := &runtimeServer{items: []*runtimeapi.PodSandbox{
		{Id: "aaaa", State: runtimeapi.PodSandboxState_SANDBOX_READY, Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "app", Uid: "u1"}},
		{Id: "bbbb", State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY},
	}}
	sock := serve(t, srv)
	sbs, err := New("unix://"+sock, 0).ListPodSandboxes(context.Background())
	if err != nil || len(sbs) != 2 || sbs[0] != (Sandbox{ID: "aaaa", Namespace: "app", Name: "web", UID: "u1", Ready: true}) || sbs[1].Ready {
		t.Fatalf("%+v %v", sbs, err)
	}
	if _, err := New(filepath.Join(t.TempDir(), "absent.sock"), 0).ListPodSandboxes(context.Background()); !errors.Is(err, ErrNoSocket) {
		t.Errorf("absent: %v", err)
	}
	f := filepath.Join(t.TempDir(), "file")
	os.WriteFile(f, nil, 0o600)
	if _, err := New(f, 0).ListPodSandboxes(context.Background()); !errors.Is(err, ErrNoSocket) {
		t.Errorf("file: %v", err)
	}
	hung := &runtimeServer{block: make(chan struct{})}
	defer close(hung.block)
	start := time.Now()
	if _, err := New(serve(t, hung), 300*time.Millisecond).ListPodSandboxes(context.Background()); err == nil {
		t.Error("a runtime that never answers gave no error")
	}
	t.Logf("hung runtime answered in %s", time.Since(start))
}
