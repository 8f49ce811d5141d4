// Package wire is gantry's contract on the wire: every NATS subject, stream,
// consumer and bucket name, and every message body that crosses a process
// boundary. It depends on the standard library only, so that any component
// (and any program written against gantry) can import it without pulling in
// the server.
//
// A change of meaning gets a new type or subject, never a silent edit of an
// existing one; golden files in testdata pin the JSON encoding.
package wire
