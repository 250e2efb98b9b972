//go:build unix

package boundedfile

import "syscall"

const (
	oNonblock  = syscall.O_NONBLOCK
	oNoFollow  = syscall.O_NOFOLLOW
	oDirectory = syscall.O_DIRECTORY
)
