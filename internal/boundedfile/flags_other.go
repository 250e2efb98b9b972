//go:build !unix

package boundedfile

const (
	oNonblock  = 0
	oNoFollow  = 0
	oDirectory = 0
)
