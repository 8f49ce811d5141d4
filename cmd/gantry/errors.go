package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/config"
)

// Exit codes of the contract.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitConflict    = 3
	exitNotFound    = 4
	exitWaitTimeout = 5
)

// exitError carries the exit code an error maps to.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError is bad usage or invalid input: exit 2.
func usageError(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// withCode wraps err so that it exits with code.
func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

// exitCode maps err to the contract's exit codes: the one place where the
// error vocabulary (client's, the same whether a local store or a remote
// service answered) becomes a code.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, client.ErrConflict):
		return exitConflict
	case errors.Is(err, client.ErrNotFound):
		return exitNotFound
	case errors.Is(err, client.ErrGaveUp):
		return exitWaitTimeout
	case errors.Is(err, client.ErrInvalid), errors.Is(err, client.ErrExists), errors.Is(err, client.ErrIllegalMove),
		errors.Is(err, config.ErrInvalid), errors.Is(err, broker.ErrInsecureListen), isCobraUsage(err):
		return exitUsage
	}
	return exitFailure
}

// isCobraUsage recognises the argument errors cobra returns as plain errors.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "invalid argument"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
