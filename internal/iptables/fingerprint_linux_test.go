//go:build linux

package iptables

import (
	"testing"
	"unsafe"
)

// TestBlobBuffer: the GET_ENTRIES buffer has exactly the asked length and
// capacity (getsockopt is given len(buf) and the blob is walked to its
// end), is zeroed and writable end to end, and a buffer of a huge page or
// more starts on a huge-page boundary (so the MADV_HUGEPAGE advice can
// apply).
func TestBlobBuffer(t *testing.T) {
	for _, n := range []int{1, entriesHdr + 4096, hugePage - 1, hugePage, hugePage + 1, 3*hugePage + 12345} {
		buf, unmap, err := blobBuffer(n)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if len(buf) != n || cap(buf) != n {
			t.Errorf("%d bytes: len %d cap %d", n, len(buf), cap(buf))
		}
		if n >= hugePage && uintptr(unsafe.Pointer(&buf[0]))%hugePage != 0 {
			t.Errorf("%d bytes: start %p not on a huge-page boundary", n, &buf[0])
		}
		for i := 0; i < n; i += 4096 {
			if buf[i] != 0 {
				t.Fatalf("%d bytes: byte %d not zero", n, i)
			}
			buf[i] = 1
		}
		buf[n-1] = 1
		unmap()
	}
}
