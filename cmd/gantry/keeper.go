package main

import (
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/lease"
)

// addKeeper adds the lease keeper: it registers resources (an existing one
// keeps its state), records lease expiries (LEASE_EXPIRED, once however many
// keepers run) and returns resources whose holder's lease is gone to
// AVAILABLE (or FAULT, by policy).
func (p *process) addKeeper(js jetstream.JetStream, log *slog.Logger, resources []lease.ResourceSpec) error {
	keeper, err := lease.NewKeeper(js, lease.KeeperConfig{
		Audit:     audit.NewEmitter(js, "keeper", nil),
		Logger:    log.With("component", "kv"),
		Resources: resources,
	})
	if err != nil {
		return err
	}
	p.addActor("keeper", keeper)
	return nil
}
