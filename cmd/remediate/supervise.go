package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// The Go runtime exits 2 on a fatal error or an unrecovered panic in any
// goroutine, the code --once uses for "findings present". So --once runs
// its pass in a child process (this executable again) that reports
// findings as childFindings; the parent maps that to exitFindings and any
// other failure — including a runtime crash or a signal — to exitError.
const (
	onceChildEnv  = "REMEDIATE_ONCE_CHILD"
	childFindings = 3
)

// wantsOnce reports whether args ask for a --once run.
func wantsOnce(args []string) bool {
	for _, a := range args {
		switch a {
		case "--once", "-once", "--once=true", "-once=true":
			return true
		case "--":
			return false
		}
	}
	return false
}

// superviseOnce runs --once in a child and returns the exit code to use;
// ok is false when this process should run the command itself (not --once,
// or it is the child).
func superviseOnce(args []string) (code int, ok bool) {
	if !wantsOnce(args) || os.Getenv(onceChildEnv) == "1" {
		return 0, false
	}
	exe, err := os.Executable()
	if err != nil {
		return 0, false // run in-process: a crash then exits 2, as before
	}
	cmd := exec.Command(exe, args...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), onceChildEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		os.Stderr.WriteString("remediate: starting the --once pass: " + err.Error() + "\n")
		return exitError, true
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case err := <-done:
			return onceExitCode(err), true
		}
	}
}

// onceExitCode maps the child's exit to the documented codes.
func onceExitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() && ee.ExitCode() == childFindings {
		return exitFindings
	}
	return exitError
}

// childExitCode is what the --once child exits with for Run's code.
func childExitCode(code int) int {
	if code == exitFindings && os.Getenv(onceChildEnv) == "1" {
		return childFindings
	}
	return code
}
