// Package leaktest holds the goroutine-leak options every package's TestMain
// shares, so a library goroutine known to outlive its connection is named once.
package leaktest

import "go.uber.org/goleak"

// Options returns goleak's options for a package's TestMain, with extra
// appended.
//
// nats.go v1.55.0 starts resetPendingAcksOnReconnect for the first async
// publish; when the publisher is cleaned up before that goroutine reads its
// status channel, it reads a nil channel and blocks for the life of the
// process. It holds no connection or file, so it is ignored rather than
// reported as ours.
func Options(extra ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
	}, extra...)
}
