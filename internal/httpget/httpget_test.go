package httpget

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A 302 into another local listener is refused, named, and its target
// never asked.
func TestRedirectRefused(t *testing.T) {
	var hits atomic.Int32
	secret := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "hunter2")
	}))
	defer secret.Close()
	redir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, secret.URL+"/creds", http.StatusFound)
	}))
	defer redir.Close()
	status, body, err := Get(context.Background(), NewClient(Options{}), redir.URL, "", 0, 0)
	if !errors.Is(err, ErrRedirect) || status != http.StatusFound || len(body) != 0 ||
		!strings.Contains(err.Error(), `HTTP 302 redirect to "`+secret.URL+`/creds" not followed`) {
		t.Errorf("status %d body %q err %v", status, body, err)
	}
	if hits.Load() != 0 {
		t.Errorf("target fetched %d times", hits.Load())
	}
}

// The environment's proxy is never used (HTTP_PROXY would take a
// node-local request, and what it carries, off the node).
func TestNoProxyFromEnvironment(t *testing.T) {
	tr, ok := NewClient(Options{}).Transport.(*http.Transport)
	if !ok || tr.Proxy != nil || !tr.DisableKeepAlives || tr.ResponseHeaderTimeout <= 0 {
		t.Errorf("transport %+v", tr)
	}
}

func TestBounds(t *testing.T) {
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strings.Repeat("x", 10000))
	}))
	defer big.Close()
	_, body, err := Get(context.Background(), NewClient(Options{}), big.URL, "", 0, 1000)
	if !errors.Is(err, ErrTooLarge) || len(body) != 1000 {
		t.Errorf("%d bytes, err %v", len(body), err)
	}
	block := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer hung.Close()
	defer close(block)
	start := time.Now()
	_, _, err = Get(context.Background(), NewClient(Options{Timeout: 200 * time.Millisecond}), hung.URL, "", 0, 0)
	var terr *TransportError
	if !errors.As(err, &terr) || time.Since(start) > 2*time.Second {
		t.Errorf("after %s: %v", time.Since(start), err)
	}
}

// Every HTTP fetch of the daemon goes through NewClient: no production
// file uses http.DefaultClient, http.Get/Head/Post or builds its own
// http.Client (internal/kubelet brings its TLS transport, built from the
// kubeconfig, to NewClient); internal/testing is test code.
func TestOneHTTPClient(t *testing.T) {
	root := filepath.Join("..", "..")
	allowed := map[string]bool{"internal/httpget": true}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && strings.HasPrefix(d.Name(), ".") || rel == "internal/testing" || d.Name() == "testdata" || d.Name() == "_output" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || allowed[filepath.Dir(rel)] {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "http" {
					switch x.Sel.Name {
					case "DefaultClient", "DefaultTransport", "Get", "Head", "Post", "PostForm":
						t.Errorf("%s uses http.%s: use httpget.NewClient", rel, x.Sel.Name)
					}
				}
			case *ast.CompositeLit:
				if sel, ok := x.Type.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "http" && (sel.Sel.Name == "Client" || sel.Sel.Name == "Transport") {
						t.Errorf("%s builds an http.%s: use httpget.NewClient", rel, sel.Sel.Name)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
