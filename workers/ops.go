package workers

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/tasks"
)

// presenceWindow is how far back the presence entry's per-queue counts
// reach.
const presenceWindow = time.Hour

// openOps opens the queues and workers buckets and reads which configured
// queues are paused, before any consumer is created. A broker of an
// earlier release has neither bucket: the workers then run without queue
// pauses and presence, and say so.
func (w *Workers) openOps(ctx context.Context) error {
	w.started = time.Now()
	w.paused = map[string]bool{}
	var err error
	if w.presence, err = tasks.NewPresence(ctx, w.js); errors.Is(err, jetstream.ErrBucketNotFound) {
		w.log.Warn("no gantry_workers bucket (a broker of an earlier release): this worker is not listed by 'gantry worker ls'")
		w.presence = nil
	} else if err != nil {
		return err
	}
	if w.queues, err = tasks.NewQueues(ctx, w.js); errors.Is(err, jetstream.ErrBucketNotFound) {
		w.log.Warn("no gantry_queues bucket (a broker of an earlier release): queue pauses are not honoured")
		w.queues = nil
		return nil
	} else if err != nil {
		return err
	}
	for _, q := range w.cfg.Queues {
		st, err := w.queues.Get(ctx, q.Name)
		if err != nil {
			return err
		}
		if st.Paused {
			w.paused[q.Name] = true
			w.log.Warn("queue paused: its tasks wait until 'gantry queue resume'", "queue", q.Name)
		}
	}
	return nil
}

// followPauses watches gantry_queues and pauses or resumes the consumers of
// a configured queue when its state changes, until ctx ends. Every worker
// does it (the broker's pause is idempotent), so a pause holds even when
// the operator's own pause of the consumers was cut short.
func (w *Workers) followPauses(ctx context.Context) {
	if w.queues == nil {
		return
	}
	watcher, err := w.queues.KeyValue().WatchAll(ctx)
	if err != nil {
		w.log.Warn("watch queue pauses", "err", err)
		return
	}
	defer func() { _ = watcher.Stop() }()
	known := maps.Clone(w.paused)
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-watcher.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			queue := e.Key()
			if !slices.ContainsFunc(w.cfg.Queues, func(q Queue) bool { return q.Name == queue }) {
				continue
			}
			paused := e.Operation() == jetstream.KeyValuePut && tasks.DecodeQueueState(queue, e.Value()).Paused
			if !paused && !known[queue] {
				// Not paused and not known to be: nothing to undo.
				continue
			}
			if _, err := tasks.PauseConsumers(ctx, w.js, queue, paused); err != nil && ctx.Err() == nil {
				w.log.Warn("apply queue pause", "queue", queue, "paused", paused, "err", err)
				continue
			}
			if paused != known[queue] {
				w.log.Info("queue pause applied", "queue", queue, "paused", paused)
			}
			known[queue] = paused
		}
	}
}

// snapshot is the workers' cumulative per-queue counts at one time.
type snapshot struct {
	at     time.Time
	queues map[string]*wire.QueueWindow
}

// heartbeat writes this process's presence every PresenceInterval until ctx
// ends. It runs on real time, as the entry's TTL does on the broker.
func (w *Workers) heartbeat(ctx context.Context) {
	if w.presence == nil {
		return
	}
	snaps := []snapshot{{at: w.started, queues: map[string]*wire.QueueWindow{}}}
	t := time.NewTicker(w.cfg.PresenceInterval)
	defer t.Stop()
	for {
		now := time.Now()
		cur := snapshot{at: now, queues: w.metrics.window()}
		if now.Sub(snaps[len(snaps)-1].at) >= time.Minute {
			snaps = append(snaps, cur)
		}
		for len(snaps) > 1 && now.Sub(snaps[1].at) >= presenceWindow {
			snaps = snaps[1:]
		}
		if err := w.presence.Put(ctx, w.info(now, cur, snaps[0]), w.presenceTTL()); err != nil && ctx.Err() == nil {
			w.log.Warn("write presence", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// presenceTTL is how long the presence entry lives without a heartbeat.
func (w *Workers) presenceTTL() time.Duration { return kv.TTLSeconds(3 * w.cfg.PresenceInterval) }

// info is this process's presence entry at now: its running tasks, and
// per queue what happened between base and cur.
func (w *Workers) info(now time.Time, cur, base snapshot) wire.WorkerInfo {
	host, _ := os.Hostname()
	info := wire.WorkerInfo{Name: w.cfg.Name, Host: host, PID: os.Getpid(), Version: w.cfg.Version,
		StartedAt: w.started.UTC(), Heartbeat: now.UTC(), TTL: w.presenceTTL().String()}
	for _, q := range w.cfg.Queues {
		info.Queues = append(info.Queues, q.Name)
		win := wire.QueueWindow{Queue: q.Name, Since: base.at.UTC(), Wait: emptyHistogram(), Run: emptyHistogram()}
		if c := cur.queues[q.Name]; c != nil {
			win = *c
			win.Since = base.at.UTC()
			if b := base.queues[q.Name]; b != nil {
				win.Succeeded -= b.Succeeded
				win.NeedsReview -= b.NeedsReview
				win.Cancelled -= b.Cancelled
				win.Retries -= b.Retries
				win.Wait = subHistogram(c.Wait, b.Wait)
				win.Run = subHistogram(c.Run, b.Run)
			}
		}
		info.Window = append(info.Window, win)
	}
	w.rmu.Lock()
	info.Running = len(w.running)
	for _, rt := range w.running {
		info.Tasks = append(info.Tasks, rt.info)
		for i := range info.Window {
			if info.Window[i].Queue == rt.info.Queue {
				info.Window[i].Running++
			}
		}
	}
	w.rmu.Unlock()
	slices.SortFunc(info.Tasks, func(a, b wire.RunningTask) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if len(info.Tasks) > wire.MaxListedTasks {
		info.Tasks = info.Tasks[:wire.MaxListedTasks]
	}
	return info
}

// leave removes this process's presence entry, so it disappears at once.
func (w *Workers) leave(ctx context.Context) {
	if w.presence == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := w.presence.Delete(ctx, w.cfg.Name); err != nil {
		w.log.Debug("remove presence", "err", err)
	}
}
