package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/disk"
)

// Defaults of the storage settings of Config.
const (
	DefaultMinFreeSpace = 64 << 20
	DefaultStorageCheck = 2 * time.Second
)

// ErrStorage marks the broker's store failing: a write failed (a full
// disk, most often) or its data dir is short of room.
var ErrStorage = errors.New("broker storage failing")

// storage watches the broker's store. nats-server makes a stream whose
// write failed (ENOSPC) refuse every later write, without answering the
// publisher, until its store is loaded again; it never does that itself.
// So the watch notes each critical write error nats-server logs, and once
// the data dir has MinFreeSpace again it restarts JetStream (streams and
// buckets load from disk, nothing acknowledged is lost) and provisions it
// again.
type storage struct {
	b *Broker

	mu     sync.Mutex
	failed error // the write error, until JetStream is restarted

	nc   *nats.Conn
	svc  micro.Service
	stop chan struct{}
	done chan struct{}
}

// noteLog looks at an error nats-server logged for a failed write.
func (s *storage) noteLog(msg string) {
	if !strings.Contains(msg, "critical write error") && !strings.Contains(msg, "Critical write error") &&
		!strings.Contains(msg, "disabling JetStream") {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed == nil {
		s.failed = fmt.Errorf("%w: %s", ErrStorage, msg)
	}
}

// health says whether the store can be written, and why not.
func (s *storage) health() (wire.BrokerHealth, error) {
	h := wire.BrokerHealth{StorageOK: true}
	free, ferr := disk.Free(s.b.cfg.DataDir)
	h.FreeBytes = free
	s.mu.Lock()
	err := s.failed
	s.mu.Unlock()
	srv := s.b.server()
	switch {
	case err != nil:
	case srv != nil && !srv.JetStreamEnabled():
		err = fmt.Errorf("%w: JetStream is disabled", ErrStorage)
	case ferr != nil:
		err = fmt.Errorf("%w: %w", ErrStorage, ferr)
	case free < s.b.cfg.MinFreeSpace:
		err = fmt.Errorf("%w: %d bytes free in the data dir %s, want at least %d", ErrStorage, free, s.b.cfg.DataDir, s.b.cfg.MinFreeSpace)
	}
	if err != nil {
		h.StorageOK, h.Error = false, err.Error()
	}
	return h, err
}

// start serves SubjectBrokerHealth and watches the store until close.
func (s *storage) start() error {
	nc, err := s.b.Connect("gantry-broker")
	if err != nil {
		return err
	}
	// internal/rpc's convention (a success is a JSON body), without the
	// package: its tests start a broker.
	svc, err := micro.AddService(nc, micro.Config{Name: wire.BrokerServiceName, Version: "1.0.0",
		Description: "gantry broker: can it store what it is sent"})
	if err == nil {
		err = svc.AddEndpoint("health", micro.HandlerFunc(func(r micro.Request) {
			h, _ := s.health()
			if err := r.RespondJSON(h); err != nil {
				s.b.log.Warn("broker health reply not sent", "err", err)
			}
		}), micro.WithEndpointSubject(wire.SubjectBrokerHealth))
		if err != nil {
			_ = svc.Stop()
		}
	}
	if err != nil {
		nc.Close()
		return fmt.Errorf("add service %s: %w", wire.BrokerServiceName, err)
	}
	s.nc, s.svc = nc, svc
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.watch()
	return nil
}

// close stops the watch and the service.
func (s *storage) close() {
	if s.stop == nil {
		return
	}
	close(s.stop)
	<-s.done
	_ = s.svc.Stop()
	s.nc.Close()
}

// watch restarts JetStream once a failed store has room again.
func (s *storage) watch() {
	defer close(s.done)
	t := time.NewTicker(s.b.cfg.StorageCheck)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		failed := s.failed
		s.mu.Unlock()
		srv := s.b.server()
		if failed == nil && srv.JetStreamEnabled() {
			continue
		}
		free, err := disk.Free(s.b.cfg.DataDir)
		if err != nil || free < s.b.cfg.MinFreeSpace {
			continue
		}
		s.b.log.Warn("restarting JetStream after a storage failure: the data dir has room again", "free_bytes", free, "err", failed)
		if err := s.restart(srv); err != nil {
			s.b.log.Error("restart JetStream; retrying", "err", err)
			continue
		}
		s.mu.Lock()
		s.failed = nil
		s.mu.Unlock()
		s.b.log.Warn("JetStream restarted: the broker stores again")
	}
}

// restart loads JetStream again from the data dir and provisions it.
func (s *storage) restart(srv *server.Server) error {
	if srv.JetStreamEnabled() {
		if err := srv.ShutdownJetStream(); err != nil {
			return fmt.Errorf("stop JetStream: %w", err)
		}
	}
	opts := srv.JetStreamConfig()
	cfg := &server.JetStreamConfig{
		StoreDir: s.b.cfg.DataDir, SyncInterval: s.b.cfg.SyncInterval, SyncAlways: s.b.cfg.Sync == SyncAlways, Strict: true,
	}
	if opts != nil {
		cfg.Domain, cfg.UniqueTag = opts.Domain, opts.UniqueTag
	}
	if err := srv.EnableJetStream(cfg); err != nil {
		return fmt.Errorf("start JetStream: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return Provision(ctx, s.nc, ProvisionConfig{Replicas: s.b.cfg.Replicas})
}

// Healthy returns nil while the broker can store what it is sent, and an
// error matching ErrStorage otherwise: a write failed (the disk was full)
// and JetStream has not been restarted yet, or the data dir has less than
// Config.MinFreeSpace left. /readyz reports it; gantry.api.broker.health
// answers it to any client.
func (b *Broker) Healthy() error {
	_, err := b.storage.health()
	return err
}
