// Package bench measures a running gantry system as a user runs it, in the
// manner of `nats bench` and `river bench`: each scenario drives the real
// system through its public surface (task subjects, audit subjects, the
// lease store, /metrics) and measures a raw JetStream baseline on a scratch
// stream or bucket of the same server in the same run, so that the ratio
// between the two can be compared across machines and runs. `gantry bench`
// is its command.
package bench
