package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/workers"
)

// Submit a task and wait for its end, as River's Insert and a wait would.
func Example() {
	url, stop := startGantry() // a broker and workers, as 'gantry run' starts them
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.Connect(ctx, client.Options{Servers: url})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	sub, err := c.Submit(ctx, client.Task{
		Type:    "noop",
		Payload: client.NoopPayload{Sleep: "10ms"},
		Key:     "nightly-2026-11-30", // submitted once, however often this runs
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	rec, err := c.Wait(ctx, sub.ID)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rec.State, "after", rec.Attempts, "attempt(s)")

	// The same key again: nothing is published, the first task is named.
	again, err := c.Submit(ctx, client.Task{Type: "noop", Key: "nightly-2026-11-30"})
	fmt.Println(again.ID == sub.ID, again.Duplicate, err)
	// Output:
	// SUCCEEDED after 1 attempt(s)
	// true true <nil>
}

// Hold a lease while working: the holder renews it in the background, and
// its context ends if the lease is lost; another owner gets a conflict
// naming the holder.
func ExampleClient_HoldLease() {
	url, stop := startGantry()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, client.Options{Servers: url})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	h, err := c.HoldLease(ctx, "camera-1", "inspection", 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = c.AcquireLease(ctx, "camera-1", "calibration", 30*time.Second)
	var ce *client.ConflictError
	fmt.Println(errors.Is(err, client.ErrConflict), errors.As(err, &ce) && ce.Holder == "inspection")

	// ... work with the camera while h.Context() is not done ...
	fmt.Println(h.Context().Err())
	if err := h.Finish(ctx, client.Outcome{}); err != nil {
		fmt.Println(err)
	}
	// Output:
	// true true
	// <nil>
}

// startGantry starts a broker and workers on a temporary data directory,
// as 'gantry run' would, and returns the broker's URL and what stops them.
func startGantry() (string, func()) {
	dir, err := os.MkdirTemp("", "gantry-example-")
	if err != nil {
		panic(err)
	}
	b, err := broker.New(broker.Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		panic(err)
	}
	nc, err := b.Connect("example-workers")
	if err != nil {
		panic(err)
	}
	w, err := workers.New(workers.Config{}, nc)
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	<-w.Ready()
	return b.ClientURL(), func() {
		w.Stop()
		<-done
		nc.Close()
		b.Shutdown()
		_ = os.RemoveAll(dir)
	}
}
