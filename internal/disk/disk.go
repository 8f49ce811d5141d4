// Package disk tells how much room a file system has left, so that what
// failed for want of space (the broker's JetStream store, auditd's Pebble
// store) is tried again only once there is room.
package disk

// Free returns the bytes an unprivileged process can still write on the
// file system that holds path.
func Free(path string) (uint64, error) { return free(path) }
