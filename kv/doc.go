// Package kv holds the KV mechanics every gantry store shares, and nothing
// about any one domain:
//
//   - one error vocabulary (ErrNotFound, ErrExists, ErrChanged, ErrInvalid,
//     ErrConflict, ErrUnavailable) that each domain package wraps into its
//     own sentinels, so a caller can ask errors.Is(err, tasks.ErrNotFound)
//     or, across domains, errors.Is(err, kv.ErrNotFound); the services'
//     request-reply errors (internal/rpc) map to and from it too;
//   - Conflict, the one test for "the broker refused a compare-and-swap",
//     covering both codes the server uses (single server and replicated);
//   - Entries, which reads a bucket's live keys to the end of a watcher;
//   - Msg and Subject, for a write published on a key's subject with a
//     per-message TTL (KV's own Put and Update drop the TTL).
//
// The domain stores live beside it: lease (leases, resources, the keeper),
// tasks (task records, checkpoints), jobs (jobs and scheduler state) and
// egress (routes).
package kv
