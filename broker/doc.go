// Package broker embeds nats-server with JetStream. It is the only package
// that imports the server: it starts it on a data dir, waits until clients can
// connect, routes the server's log into slog, refuses to listen beyond
// loopback without authentication, and provisions every stream and KV bucket
// gantry uses, idempotently.
package broker
