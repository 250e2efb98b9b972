package procs

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// direntHeader is the fixed part of a struct linux_dirent64 as getdents64
// returns it: d_ino (u64), d_off (s64), d_reclen (u16), d_type (u8),
// followed by the NUL-terminated name, the record padded to 8 bytes.
const direntHeader = 8 + 8 + 2 + 1

// parseDirents walks the linux_dirent64 records of one getdents64 result
// (native byte order) and calls fn with each entry's inode number and
// name (which aliases buf). It stops early when fn returns false. A
// record that does not fit (a reclen shorter than the header or past the
// end of buf) ends the walk with an error: the kernel never returns one,
// so the rest of the buffer cannot be trusted.
func parseDirents(buf []byte, fn func(ino uint64, name []byte) bool) error {
	for off := 0; off < len(buf); {
		rest := buf[off:]
		if len(rest) < direntHeader {
			return fmt.Errorf("dirent at %d: %d bytes left, shorter than its header", off, len(rest))
		}
		reclen := int(binary.NativeEndian.Uint16(rest[16:18]))
		if reclen < direntHeader || reclen > len(rest) {
			return fmt.Errorf("dirent at %d: record length %d out of range (%d bytes left)", off, reclen, len(rest))
		}
		name := rest[direntHeader:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if !fn(binary.NativeEndian.Uint64(rest[0:8]), name) {
			return nil
		}
		off += reclen
	}
	return nil
}
