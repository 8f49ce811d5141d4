package main

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/lease"
)

// newRegistry returns a process's Prometheus registry, with the Go
// runtime's and the process's own collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// systemStatsTTL is how long the system collector reuses a picture of the
// system: scrapes closer together than that cost the broker nothing.
const systemStatsTTL = 10 * time.Second

// systemStatsTimeout bounds the reading of one picture.
const systemStatsTimeout = 8 * time.Second

// systemCollector exports what only the broker knows (waiting tasks,
// consumers' pending counts, leases, resources, routes, live workers, the
// scheduler's leader, auditd's lag) from client.Stats, read at scrape time
// and kept for systemStatsTTL: every process that serves it answers the
// same.
type systemCollector struct {
	stats func(ctx context.Context) (client.Stats, error)

	mu   sync.Mutex
	last client.Stats
	at   time.Time

	tasks, needsReview, paused, pending, ackPending, resState, utilisation, leases, cooldowns,
	routeScore, routeState, routeLatency, workers, leader, auditPending, auditLag, jobs, problems *prometheus.Desc
}

func newSystemCollector(stats func(ctx context.Context) (client.Stats, error)) *systemCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("gantry_"+name, help, labels, nil)
	}
	return &systemCollector{
		stats:        stats,
		tasks:        d("tasks", "Tasks by queue and state: WAITING (in the stream, not handed out), RUNNING (on a live worker), RETRY_WAIT (handed out, waiting for a retry or a delay), NEEDS_REVIEW (tasks in review).", "queue", "state"),
		needsReview:  d("tasks_needs_review", "NEEDS_REVIEW task records by queue and type.", "queue", "type"),
		paused:       d("queue_paused", "1 while the queue is paused.", "queue"),
		pending:      d("consumer_pending", "Messages of the tasks stream a consumer has not delivered yet.", "queue", "consumer"),
		ackPending:   d("consumer_ack_pending", "Messages a consumer delivered that are not acknowledged yet.", "queue", "consumer"),
		resState:     d("resource_state", "1 for the resource's current state, 0 for the others.", "resource", "state"),
		utilisation:  d("resource_utilisation_ratio", "Share of the last hour the resource was leased (busy time / wall time), from the audit store.", "resource"),
		leases:       d("leases_held", "Leases held on resources, cooldowns left out."),
		cooldowns:    d("cooldowns", "Resources and routes in COOLDOWN.", "kind"),
		routeScore:   d("route_score", "An egress route's health score (100 at best).", "route"),
		routeState:   d("route_state", "1 for the route's current state, 0 for the others.", "route", "state"),
		routeLatency: d("route_latency_seconds", "Latency of the route's last probe.", "route"),
		workers:      d("workers", "Live worker processes (presence entries in gantry_workers)."),
		leader:       d("scheduler_leader", "1 while a scheduler holds the leader lease."),
		auditPending: d("auditd_pending_events", "Events of the audit stream auditd has not stored yet."),
		auditLag:     d("auditd_lag_seconds", "Age of the oldest event auditd has not stored yet (0 when none)."),
		jobs:         d("jobs", "Scheduled jobs, paused or not.", "paused"),
		problems:     d("stats_problems", "Parts of the system picture that could not be read at the last refresh."),
	}
}

// Describe sends every metric's description.
func (c *systemCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.tasks, c.needsReview, c.paused, c.pending, c.ackPending, c.resState, c.utilisation, c.leases,
		c.cooldowns, c.routeScore, c.routeState, c.routeLatency, c.workers, c.leader, c.auditPending, c.auditLag, c.jobs, c.problems} {
		ch <- d
	}
}

// picture returns the cached picture, taking a new one when it is older
// than systemStatsTTL.
func (c *systemCollector) picture() client.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < systemStatsTTL {
		return c.last
	}
	ctx, cancel := context.WithTimeout(context.Background(), systemStatsTimeout)
	defer cancel()
	st, err := c.stats(ctx)
	if err != nil {
		st.Problems = append(st.Problems, err.Error())
	}
	c.last, c.at = st, time.Now()
	return st
}

// Collect sends the metrics of the current picture.
func (c *systemCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.picture()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, q := range st.Queues {
		g(c.tasks, float64(q.Waiting), q.Queue, string(wire.TaskWaiting))
		g(c.tasks, float64(q.Running), q.Queue, string(wire.TaskRunning))
		g(c.tasks, float64(q.RetryWait), q.Queue, string(wire.TaskRetryWait))
		g(c.tasks, float64(q.NeedsReview), q.Queue, string(wire.TaskNeedsReview))
		for typ, n := range q.NeedsReviewByType {
			g(c.needsReview, float64(n), q.Queue, typ)
		}
		g(c.paused, flag(q.Paused), q.Queue)
		for _, cs := range q.Consumers {
			g(c.pending, float64(cs.Pending), q.Queue, cs.Name)
			g(c.ackPending, float64(cs.AckPending), q.Queue, cs.Name)
		}
	}
	resCooling := 0
	for _, r := range st.Resources {
		for _, s := range wire.ResourceStates {
			g(c.resState, flag(r.State == s), r.ID, string(s))
		}
		if r.Utilisation != nil {
			g(c.utilisation, *r.Utilisation, r.ID)
		}
		if r.State == wire.ResourceCooldown {
			resCooling++
		}
	}
	held := 0
	for _, l := range st.Leases {
		if !strings.HasPrefix(l.Owner, lease.CooldownOwner("")) {
			held++
		}
	}
	g(c.leases, float64(held))
	routeCooling := 0
	for _, r := range st.Routes {
		g(c.routeScore, r.Score, r.ID)
		g(c.routeLatency, float64(r.LatencyMS)/1000, r.ID)
		for _, s := range []wire.RouteState{wire.RouteAvailable, wire.RouteCooldown, wire.RouteFault, wire.RouteDisabled} {
			g(c.routeState, flag(r.State == s), r.ID, string(s))
		}
		if r.State == wire.RouteCooldown {
			routeCooling++
		}
	}
	g(c.cooldowns, float64(resCooling), "resource")
	g(c.cooldowns, float64(routeCooling), "route")
	g(c.workers, float64(len(st.Workers)))
	g(c.leader, flag(st.Scheduler.Leading))
	g(c.auditPending, float64(st.Audit.Pending))
	g(c.auditLag, st.Audit.LagSeconds)
	paused := 0
	for _, j := range st.Jobs {
		if j.Paused {
			paused++
		}
	}
	g(c.jobs, float64(paused), "true")
	g(c.jobs, float64(len(st.Jobs)-paused), "false")
	g(c.problems, float64(len(st.Problems)))
}
