// Package dashboard is gantry's web dashboard: the pool at a glance
// (queues, throughput, workers), tasks and their live output, resources
// and who holds them, routes and their scores, jobs and their next fires,
// and the audit trail as it happens.
//
// It is a client over NATS and nothing more: every read and action goes
// through package client, so the same dashboard is served by `gantry run`
// on its --http-listen and by `gantry ui --server URL` from any machine.
// Pages are rendered on the server with html/template; a small hand-written
// script (embedded, like the stylesheet: no CDN, no build step) refreshes
// their live parts, counts down expiries and follows the Server-Sent Events
// of the audit tail and of a running task's output.
//
// Security: served on loopback without users, it trusts the machine and
// acts as the user "local" with the operator role. With users (the config
// file's auth section) every request needs one: a session login (an
// HttpOnly, SameSite=Strict cookie, Secure over TLS) or, over TLS only,
// HTTP basic authentication. Beyond loopback without users it refuses
// every request. Each POST must carry the session's CSRF token. What a
// user may do is its role's (see Role); every action, allowed or refused,
// is a DASHBOARD_ACTION audit event naming the user.
//
// A Dashboard is an actor: Run follows the finished tasks (the throughput
// sparkline) and the route probes (the last probe's stages) until Stop,
// which also ends every live stream it serves.
package dashboard
