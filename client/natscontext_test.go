package client_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gantry-dev/gantry/client"
)

// writeContext writes a nats CLI context file under dir, as 'nats context
// add' does.
func writeContext(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "nats", "context"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nats", "context", name+".json"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLoadContext reads the nats CLI's context files (not parallel: it
// sets XDG_CONFIG_HOME).
func TestLoadContext(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	t.Setenv("HOME", "/home/op")
	t.Setenv("CREDS_DIR", "/etc/nats")
	writeContext(t, dir, "plant", `{"description":"plant broker","url":"nats://plant:4222","user":"ops","password":"s3cret",
		"creds":"$CREDS_DIR/ops.creds","ca":"~/ca.pem","jetstream_domain":"","inbox_prefix":""}`)
	writeContext(t, dir, "ngs", `{"url":"tls://connect.ngs.global","nsc":"nsc://acme/orders/new"}`)

	if name, err := client.SelectedContext(); name != "" || err != nil {
		t.Errorf("SelectedContext with no context.txt = %q, %v; want \"\", nil", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nats", "context.txt"), []byte("plant\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if name, err := client.SelectedContext(); name != "plant" || err != nil {
		t.Errorf("SelectedContext = %q, %v; want plant", name, err)
	}
	o, err := client.LoadContext("plant")
	want := client.Options{Servers: "nats://plant:4222", User: "ops", Password: "s3cret", Creds: "/etc/nats/ops.creds", TLSCA: "/home/op/ca.pem"}
	if err != nil || o != want {
		t.Errorf("LoadContext(plant) = %+v, %v; want %+v", o, err, want)
	}
	if _, err := client.LoadContext("nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("LoadContext(nope) = %v, want ErrNotFound", err)
	}
	if _, err := client.LoadContext("ngs"); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("LoadContext(ngs) = %v, want ErrInvalid (nsc is not read)", err)
	}
	if _, err := client.LoadContext("../etc"); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("LoadContext(../etc) = %v, want ErrInvalid", err)
	}
}
