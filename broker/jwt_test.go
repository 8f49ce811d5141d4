package broker_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
)

// TestOperatorMode runs the broker with an operator and an account: its
// in-process user provisions, and users are creds files of a role minted
// with MintCreds, whose permissions the broker enforces.
func TestOperatorMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	op, acc, seed, sys := brokertest.OperatorFiles(t, dir)
	b, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Logger: brokertest.Logger(t),
		Operator: &broker.Operator{OperatorJWT: op, AccountJWT: acc, AccountSeed: seed, SystemAccountJWT: sys}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)

	creds := func(r broker.Role) string {
		data, err := broker.MintCreds(r, "test-"+string(r), seed, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, string(r)+".creds")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if nc, err := nats.Connect(b.ClientURL()); err == nil {
		nc.Close()
		t.Error("connect without creds succeeded, want refused")
	}
	errs := make(chan error, 4)
	nc, err := nats.Connect(b.ClientURL(), nats.UserCredentials(creds(broker.RoleViewer)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatalf("connect as a viewer: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.KeyValue(ctx(t), wire.BucketTasks); err != nil {
		t.Errorf("viewer opens %s: %v", wire.BucketTasks, err)
	}
	if err := nc.Publish("$KV.gantry_leases.cam1", nil); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "$KV.gantry_leases.cam1") {
			t.Errorf("viewer writing a lease: %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("viewer writing a lease: no permissions violation within 5s")
	}
	opNC, err := nats.Connect(b.ClientURL(), nats.UserCredentials(creds(broker.RoleOperator)))
	if err != nil {
		t.Fatalf("connect as an operator: %v", err)
	}
	defer opNC.Close()
	opJS, _ := jetstream.New(opNC)
	if _, err := opJS.Publish(ctx(t), "$KV.gantry_leases.cam1", []byte("x")); err != nil {
		t.Errorf("operator writing a lease: %v", err)
	}
}
