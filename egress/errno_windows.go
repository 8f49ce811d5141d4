//go:build windows

package egress

import "syscall"

// refusedErrnos are the errors that mean the peer refused or reset the
// connection; Windows reports them as WSA error codes.
var refusedErrnos = []error{
	syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED,
	syscall.Errno(10061), // WSAECONNREFUSED
	syscall.WSAECONNRESET,
	syscall.WSAECONNABORTED,
}
