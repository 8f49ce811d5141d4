//go:build !windows

package egress

import "syscall"

// refusedErrnos are the errors that mean the peer refused or reset the
// connection.
var refusedErrnos = []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED}
