package cpustat

import "syscall"

// syscallNonblock opens without blocking on a FIFO planted where a file
// is expected.
const syscallNonblock = syscall.O_NONBLOCK
