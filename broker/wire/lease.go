package wire

// EventResourceMoveRefused records a resource state move that was refused
// as illegal (say, an operator's AVAILABLE -> RUNNING), with from, to and
// the reason given, on gantry.audit.resource.move_refused. The kv resource
// store publishes it; nothing changed.
const EventResourceMoveRefused EventType = "RESOURCE_MOVE_REFUSED"
