package cni

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

const calico = `{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "calico", "log_level": "info", "ipam": {"type": "calico-ipam"}},
    {"type": "bandwidth", "capabilities": {"bandwidth": true}},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
  ]
}`

func write(t *testing.T, dir, name, body string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), mode); err != nil {
		t.Fatal(err)
	}
}

func bins(t *testing.T, names ...string) string {
	t.Helper()
	d := t.TempDir()
	for _, n := range names {
		write(t, d, n, "#!/bin/sh\n", 0o755)
	}
	return d
}

func TestRead(t *testing.T) {
	full := bins(t, "calico", "bandwidth", "portmap", "flannel")
	for _, tc := range []struct {
		name     string
		files    map[string]string
		bin      string
		noDir    bool
		wantDir  bool // ConfDirErr set
		inUse    string
		inUseErr string
		missing  []string
		files2   int
	}{
		{name: "missing dir", noDir: true, wantDir: true},
		{name: "empty", files: map[string]string{}, bin: full},
		{name: "other files only", files: map[string]string{"README": "x", "calico-kubeconfig": "y"}, bin: full},
		{name: "healthy", files: map[string]string{"10-calico.conflist": calico, "calico-kubeconfig": "kubeconfig"}, bin: full, inUse: "10-calico.conflist", files2: 1},
		{name: "truncated", files: map[string]string{"10-calico.conflist": calico[:60]}, bin: full, inUse: "10-calico.conflist", inUseErr: "not a CNI configuration", files2: 1},
		{name: "empty file", files: map[string]string{"10-calico.conflist": ""}, bin: full, inUse: "10-calico.conflist", inUseErr: "empty file", files2: 1},
		{name: "no plugins", files: map[string]string{"10-x.conflist": `{"name":"x","plugins":[]}`}, bin: full, inUse: "10-x.conflist", inUseErr: "no plugins", files2: 1},
		{name: "plugin without type", files: map[string]string{"10-x.conflist": `{"name":"x","plugins":[{"ipam":{}}]}`}, bin: full, inUse: "10-x.conflist", inUseErr: "no plugin type", files2: 1},
		{name: "type with a path", files: map[string]string{"10-x.conflist": `{"name":"x","plugins":[{"type":"../../bin/sh"}]}`}, bin: full, inUse: "10-x.conflist", inUseErr: "not a file name", files2: 1},
		{name: "plugin missing", files: map[string]string{"10-calico.conflist": calico}, bin: bins(t, "calico"), inUse: "10-calico.conflist", missing: []string{"bandwidth", "portmap"}, files2: 1},
		{name: "plugin not executable", files: map[string]string{"10-calico.conflist": calico}, bin: func() string {
			d := bins(t, "calico", "bandwidth")
			write(t, d, "portmap", "x", 0o644)
			return d
		}(), inUse: "10-calico.conflist", missing: []string{"portmap"}, files2: 1},
		{name: "bin dir missing", files: map[string]string{"10-calico.conflist": calico}, bin: "/nonexistent/bin", inUse: "10-calico.conflist", missing: []string{"calico", "bandwidth", "portmap"}, files2: 1},
		{name: "single conf", files: map[string]string{"10-flannel.conf": `{"name":"cbr0","type":"flannel"}`}, bin: full, inUse: "10-flannel.conf", files2: 1},
		{name: "first by name decides", files: map[string]string{"05-broken.conflist": "{", "10-calico.conflist": calico}, bin: full, inUse: "05-broken.conflist", inUseErr: "not a CNI configuration", files2: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "net.d")
			if !tc.noDir {
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for n, b := range tc.files {
					write(t, dir, n, b, 0o644)
				}
			}
			d := Read(dir, tc.bin)
			if (d.ConfDirErr != nil) != tc.wantDir {
				t.Fatalf("ConfDirErr = %v", d.ConfDirErr)
			}
			if tc.noDir && !errors.Is(d.ConfDirErr, fs.ErrNotExist) {
				t.Errorf("missing dir error %v is not ErrNotExist", d.ConfDirErr)
			}
			if len(d.Files) != tc.files2 {
				t.Errorf("files %+v, want %d", d.Files, tc.files2)
			}
			f := d.InUse()
			if tc.inUse == "" {
				if f != nil {
					t.Errorf("in use %+v, want none", f)
				}
				return
			}
			if f == nil || f.Name != tc.inUse {
				t.Fatalf("in use %+v, want %s", f, tc.inUse)
			}
			if (tc.inUseErr == "") != (f.Err == "") || !strings.Contains(f.Err, tc.inUseErr) {
				t.Errorf("error %q, want %q", f.Err, tc.inUseErr)
			}
			if !reflect.DeepEqual(f.MissingPlugins, tc.missing) {
				t.Errorf("missing %v, want %v", f.MissingPlugins, tc.missing)
			}
		})
	}
}

func TestReadBounds(t *testing.T) {
	dir := t.TempDir()
	big := strings.Repeat(" ", MaxFileSize+1)
	write(t, dir, "00-big.conflist", big, 0o644)
	if err := syscall.Mkfifo(filepath.Join(dir, "01-fifo.conflist"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < MaxFiles+5; i++ {
		write(t, dir, "z"+strings.Repeat("x", i)+".conf", `{"type":"bridge"}`, 0o644)
	}
	d := Read(dir, t.TempDir()) // a FIFO must not block this
	if !strings.Contains(d.Files[0].Err, "too large") {
		t.Errorf("big file: %+v", d.Files[0])
	}
	if !strings.Contains(d.Files[1].Err, "not a regular file") {
		t.Errorf("fifo: %+v", d.Files[1])
	}
	if len(d.Files) != MaxFiles || d.Omitted != 7 {
		t.Errorf("%d files, %d omitted", len(d.Files), d.Omitted)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("10-calico.conflist", []byte(calico))
	f.Add("10-flannel.conf", []byte(`{"name":"cbr0","type":"flannel","delegate":{"isDefaultGateway":true}}`))
	f.Add("x.conflist", []byte(`{"name":"x","plugins":[{"type":""}]}`))
	f.Add("x.json", []byte(`[1,2,3]`))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		network, _, plugins, err := Parse(name, data)
		if err != nil {
			return
		}
		if len(plugins) == 0 {
			t.Fatalf("no error and no plugins: %q", data)
		}
		for _, p := range plugins {
			if checkType(p) != nil {
				t.Fatalf("accepted plugin type %q", p)
			}
		}
		if strings.HasSuffix(name, ".conflist") && network == "" {
			t.Fatal("accepted a list without a name")
		}
	})
}
