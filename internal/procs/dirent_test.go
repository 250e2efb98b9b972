package procs

import (
	"encoding/binary"
	"slices"
	"testing"
)

// dirent encodes one linux_dirent64 record (native byte order, padded
// to 8 bytes).
func dirent(ino uint64, name string) []byte {
	n := (direntHeader + len(name) + 1 + 7) &^ 7
	b := make([]byte, n)
	binary.NativeEndian.PutUint64(b[0:8], ino)
	binary.NativeEndian.PutUint64(b[8:16], 1)
	binary.NativeEndian.PutUint16(b[16:18], uint16(n))
	b[18] = 4 // DT_DIR
	copy(b[direntHeader:], name)
	return b
}

func TestParseDirents(t *testing.T) {
	buf := slices.Concat(dirent(1, "."), dirent(2, ".."), dirent(4242, "17"), dirent(99, "a-much-longer-name-than-eight"))
	type ent struct {
		ino  uint64
		name string
	}
	var got []ent
	if err := parseDirents(buf, func(ino uint64, name []byte) bool {
		got = append(got, ent{ino, string(name)})
		return true
	}); err != nil {
		t.Fatal(err)
	}
	want := []ent{{1, "."}, {2, ".."}, {4242, "17"}, {99, "a-much-longer-name-than-eight"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// fn stops the walk.
	n := 0
	if err := parseDirents(buf, func(uint64, []byte) bool { n++; return n < 2 }); err != nil || n != 2 {
		t.Fatalf("stopped after %d: %v", n, err)
	}
	// A record that does not fit ends the walk with an error, after the
	// records before it.
	short := dirent(7, "8")
	binary.NativeEndian.PutUint16(short[16:18], 4) // shorter than its header
	long := dirent(7, "8")
	binary.NativeEndian.PutUint16(long[16:18], 200) // past the end
	for name, bad := range map[string][]byte{"short reclen": short, "long reclen": long, "truncated header": dirent(7, "8")[:10]} {
		n := 0
		err := parseDirents(slices.Concat(dirent(3, "5"), bad), func(uint64, []byte) bool { n++; return true })
		if err == nil || n != 1 {
			t.Errorf("%s: %d entries, err %v", name, n, err)
		}
	}
}

func FuzzParseDirents(f *testing.F) {
	f.Add(slices.Concat(dirent(1, "."), dirent(4242, "17")))
	f.Add(dirent(7, "12345678901234567890")[:20])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		total := 0
		_ = parseDirents(b, func(ino uint64, name []byte) bool {
			total += direntHeader + len(name)
			if total > len(b) {
				t.Fatalf("entries past the buffer: %d > %d", total, len(b))
			}
			_, _ = parsePID(name)
			return true
		})
	})
}

func TestParsePID(t *testing.T) {
	for name, want := range map[string]int32{"1": 1, "4242": 4242, "2147483647": 2147483647} {
		if got, ok := parsePID([]byte(name)); !ok || got != want {
			t.Errorf("%q: %d %v", name, got, ok)
		}
	}
	for _, bad := range []string{"", "0", "010", "+5", "-5", "2147483648", "99999999999", "12a", "self", "1 ", "\x00"} {
		if got, ok := parsePID([]byte(bad)); ok {
			t.Errorf("%q parsed as %d", bad, got)
		}
	}
}
