package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/kube"
)

// checkPaths fails start-up on a path flag that cannot be what it says, so
// a typo is an error and not a quiet node (a --proc-root that does not exist
// would turn every process check into "skipped"):
//
//   - --policy must be a readable file;
//   - --kubeconfig, when given, must be a readable, usable kubeconfig
//     (parsed and resolved the way the client will; the server is not
//     contacted);
//   - --proc-root must be a readable directory with sys/ (a procfs, or a
//     test fixture of one);
//   - --sys-root must be a readable directory;
//   - --xtables-lock may not exist yet (iptables creates it on first use),
//     but its directory must: a lock file in a directory that does not exist
//     is a wrong path, and a holder there would never be seen;
//   - --bundle must not exist (a bundle never replaces a file) and its
//     directory must exist and be writable: said now, not after the
//     --sample wait and the whole pass.
func checkPaths(o *options) error {
	var errs []error
	if err := readableFile(o.policy); err != nil {
		errs = append(errs, fmt.Errorf("--policy %s: %w", o.policy, err))
	}
	if o.kubeconfig != "" {
		if err := readableFile(o.kubeconfig); err != nil {
			errs = append(errs, fmt.Errorf("--kubeconfig %s: %w", o.kubeconfig, err))
		} else if _, err := kube.RESTConfig(o.kubeconfig); err != nil {
			// Corrupt or unusable: an error like a missing one, not a
			// quiet run without the cluster.
			var na *kube.NoAccessError
			if errors.As(err, &na) {
				err = errors.New(na.Reason) // "--kubeconfig PATH: why"
			}
			errs = append(errs, err)
		}
	}
	if err := readableDir(o.procRoot); err != nil {
		errs = append(errs, fmt.Errorf("--proc-root %s: %w", o.procRoot, err))
	} else if _, err := os.Stat(filepath.Join(o.procRoot, "sys")); err != nil {
		errs = append(errs, fmt.Errorf("--proc-root %s: not a procfs (no sys/)", o.procRoot))
	}
	if err := readableDir(o.sysRoot); err != nil {
		errs = append(errs, fmt.Errorf("--sys-root %s: %w", o.sysRoot, err))
	}
	if err := readableDir(o.cgroupRoot); err != nil {
		errs = append(errs, fmt.Errorf("--cgroup-root %s: %w", o.cgroupRoot, err))
	}
	if fi, err := os.Stat(o.xtablesLock); err == nil {
		if fi.IsDir() {
			errs = append(errs, fmt.Errorf("--xtables-lock %s: is a directory, not the lock file", o.xtablesLock))
		}
	} else if errors.Is(err, os.ErrNotExist) {
		if err := readableDir(filepath.Dir(o.xtablesLock)); err != nil {
			errs = append(errs, fmt.Errorf("--xtables-lock %s: its directory: %w", o.xtablesLock, err))
		}
	} else {
		errs = append(errs, fmt.Errorf("--xtables-lock %s: %w", o.xtablesLock, err))
	}
	if o.bundle != "" {
		if err := bundlePathFree(o.bundle); err != nil {
			errs = append(errs, fmt.Errorf("--bundle %s: %w", o.bundle, err))
		}
	}
	return errors.Join(errs...)
}

// bundlePathFree says why a bundle cannot be created at p, or nil.
func bundlePathFree(p string) error {
	_, lerr := os.Lstat(p)
	if lerr == nil {
		return errors.New("already exists (a bundle never replaces a file: give a new name)")
	}
	dir := filepath.Dir(p)
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("its directory %s: %w", dir, unwrapPath(err))
	}
	if !fi.IsDir() {
		return fmt.Errorf("its directory %s: not a directory", dir)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("its directory %s: not writable: %w", dir, err)
	}
	if !errors.Is(lerr, os.ErrNotExist) {
		return unwrapPath(lerr)
	}
	return nil
}

func readableFile(p string) error {
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return errors.New("is a directory, not a file")
	}
	// Bounded: a FIFO or device is refused, not waited on.
	f, err := boundedfile.Open(p)
	if err != nil {
		return unwrapPath(err)
	}
	return f.Close()
}

func readableDir(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return unwrapPath(err)
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	if err := unix.Access(p, unix.R_OK|unix.X_OK); err != nil {
		return fmt.Errorf("not readable: %w", err)
	}
	return nil
}

// unwrapPath drops the *PathError's repetition of the path (the caller
// names it with its flag).
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// stateDirWritable says why dir (or, if it does not exist yet, the
// directory it would be created in) cannot be written, or nil.
func stateDirWritable(dir string) error {
	p := dir
	for {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s is not a directory", p)
			}
			if err := unix.Access(p, unix.W_OK|unix.X_OK); err != nil {
				if p == dir {
					return err
				}
				return fmt.Errorf("cannot be created in %s: %w", p, err)
			}
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) || filepath.Dir(p) == p {
			return err
		}
		p = filepath.Dir(p)
	}
}

// readOnlyStateDir prepares a --once --dry-run on a state dir it cannot
// write: a private temporary copy of what the run reads (state.json for the
// guardrail history, the conntrack record for drift) that is removed
// afterwards, so the run reports what it would do and writes nothing in the
// real state dir. The caller warns that limits are not shared.
func readOnlyStateDir(dir string) (tmp string, cleanup func(), err error) {
	tmp, err = os.MkdirTemp("", "remediate-dry-run-")
	if err != nil {
		return "", nil, err
	}
	for _, name := range []string{"state.json", conntrack.RecordFile} {
		src, err := boundedfile.OpenBoundedNoFollow(filepath.Join(dir, name), 64<<20)
		if err != nil {
			continue // absent, unreadable, or no regular file: the run sees no history
		}
		dst, err := os.OpenFile(filepath.Join(tmp, name), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err == nil {
			_, _ = io.Copy(dst, io.LimitReader(src, 64<<20))
			dst.Close()
		}
		src.Close()
	}
	return tmp, func() { _ = os.RemoveAll(tmp) }, nil
}

// prepareStateDir checks that --state-dir can be written. A --once
// --dry-run changes nothing on the node and need not write the state dir
// either (a read-only mount, another user's directory): it runs on a
// private copy (o.stateDir is replaced, o.stateWarning says so); cleanup
// removes the copy.
func prepareStateDir(o *options) (cleanup func(), err error) {
	werr := stateDirWritable(o.stateDir)
	if werr == nil {
		return func() {}, nil
	}
	if !o.once || !o.dryRun {
		return nil, fmt.Errorf("--state-dir %s: not writable: %v (remediate --once --dry-run can run without writing it)", o.stateDir, unwrapPath(werr))
	}
	tmp, cleanup, err := readOnlyStateDir(o.stateDir)
	if err != nil {
		return nil, fmt.Errorf("--state-dir %s is not writable (%v), and no private copy: %w", o.stateDir, werr, err)
	}
	o.stateWarning = fmt.Sprintf("state dir %s is not writable (%v): this dry run read a copy of its guardrail state and wrote nothing; rate limits and cooldowns are not shared with the daemon", o.stateDir, werr)
	o.journalDir, o.stateDir = o.stateDir, tmp
	return cleanup, nil
}
