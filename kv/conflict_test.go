package kv_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/kv"
)

// TestConflict provokes each answer a real server gives to a refused
// compare-and-swap and checks that Conflict knows it: 10071 ("wrong last
// sequence: N", a single server's answer to a stale expected sequence) and
// 10164 ("wrong last sequence", the constant form a replicated stream gives
// while a proposal for the same subject is in flight). The latter comes from
// the same server check whatever the stream's replicas, and an atomic batch
// that writes a subject and then expects its last sequence reaches it
// deterministically. Errors a write can meet that are no conflict must not
// count as one.
func TestConflict(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	b, err := env.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "conflict"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := b.Create(ctx, "k", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Update(ctx, "k", []byte("2"), rev); err != nil {
		t.Fatal(err)
	}
	_, createErr := b.Create(ctx, "k", []byte("3"))
	_, updateErr := b.Update(ctx, "k", []byte("3"), rev)
	_, publishErr := env.JS.PublishMsg(ctx, &nats.Msg{Subject: "$KV.conflict.k", Data: []byte("3")},
		jetstream.WithExpectLastSequencePerSubject(rev))

	if _, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "CONFLICT", Subjects: []string{"conflict.>"}, AllowAtomicPublish: true,
	}); err != nil {
		t.Fatal(err)
	}
	batchErr := conflictInBatch(ctx, t, env.NC, env.JS, "conflict.a")

	_, getErr := b.Get(ctx, "missing")
	_, ttlErr := env.JS.PublishMsg(ctx, &nats.Msg{Subject: "conflict.b"}, jetstream.WithMsgTTL(time.Minute))
	_, noStreamErr := env.JS.Publish(ctx, "nostream", nil)

	for _, tc := range []struct {
		name string
		err  error
		code jetstream.ErrorCode // the server's code, 0 when none is pinned
		want bool
	}{
		{"kv create of a live key", createErr, jetstream.JSErrCodeStreamWrongLastSequence, true},
		{"kv update at a stale revision", updateErr, jetstream.JSErrCodeStreamWrongLastSequence, true},
		{"publish expecting a stale subject sequence", publishErr, jetstream.JSErrCodeStreamWrongLastSequence, true},
		{"subject in flight (batch)", batchErr, jetstream.JSErrCodeStreamWrongLastSequenceConstant, true},
		{"kv get of a missing key", getErr, 0, false},
		{"publish with a TTL the stream refuses", ttlErr, 10166, false}, // JSMessageTTLDisabledErr
		{"publish to no stream", noStreamErr, 0, false},
		{"nil", nil, 0, false},
	} {
		if tc.want || tc.code != 0 {
			var apiErr *jetstream.APIError
			if !errors.As(tc.err, &apiErr) || apiErr.ErrorCode != tc.code {
				t.Errorf("%s: error = %v, want the server's code %d", tc.name, tc.err, tc.code)
				continue
			}
		}
		if got := kv.Conflict(tc.err); got != tc.want {
			t.Errorf("%s: Conflict(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// conflictInBatch publishes an atomic batch of two messages to subject, the
// second expecting the subject's last sequence, and returns the error of
// its commit: the server refuses to check a subject the batch already
// writes.
func conflictInBatch(ctx context.Context, t *testing.T, nc *nats.Conn, js jetstream.JetStream, subject string) error {
	t.Helper()
	batch := func(seq int) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Header.Set("Nats-Batch-Id", "b1")
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(seq))
		return m
	}
	if err := nc.PublishMsg(batch(1)); err != nil {
		t.Fatal(err)
	}
	commit := batch(2)
	commit.Header.Set("Nats-Batch-Commit", "1")
	_, err := js.PublishMsg(ctx, commit, jetstream.WithExpectLastSequencePerSubject(0))
	return err
}
