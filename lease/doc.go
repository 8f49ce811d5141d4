// Package lease holds leases, the resources they guard and the keeper that
// cleans up after dead holders.
//
// Leases (gantry_leases) are exclusive claims on a resource with a per-key
// TTL that the broker enforces: acquire is create-if-absent, renew is a
// compare-and-swap publish on the key's revision that restarts the TTL, and
// release deletes at the holder's revision. A lease is never taken from a
// live holder; a conflict is a *ConflictError naming the holder and its
// expiry. Hold wraps a lease in a Holder that renews it every TTL/3 and
// cancels its context as soon as the lease is lost, so work stops.
//
// Resources (gantry_resources) carry the state machine AVAILABLE, LEASED,
// RUNNING, COOLDOWN, FAULT and DISABLED. Every move is a compare-and-swap on
// the key's revision, checked against the allowed moves (AllowedMove), and an
// audit event. Resources.Lease is what a task uses: it refuses a DISABLED or
// FAULT resource, acquires the lease, moves the resource to LEASED and hands
// back a ResourceHolder whose Start and Finish drive the rest. A resource id
// that is not registered can still be leased: it then gets a plain lease and
// no state machine.
//
// A busy resource has a line (gantry_waiters): Resources.LeaseWait takes a
// place in it, a key with a per-key TTL its waiter renews, follows the
// resource's lease, state and line with KV watches, and takes the lease
// the moment the lease is gone, the resource is neither DISABLED nor FAULT
// and its place is first (priority, then arrival). A dead waiter's place
// lapses with its TTL. Workers and `gantry lease acquire|run --wait` wait
// in it.
//
// The Keeper actor registers the resources of the config file, records
// lease expiries (LEASE_EXPIRED, one event per expiry even with several
// keepers) and reclaims resources left LEASED, RUNNING or COOLDOWN whose
// lease is gone.
package lease
