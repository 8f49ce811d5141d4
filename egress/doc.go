// Package egress holds gantry's egress routes: the typed store of route
// health in gantry_routes (written by healthd, read by workers and the
// CLI), the Picker that gives an http task the transport of its route (or
// of the best-scored one for "auto") and the transports themselves, direct,
// through an HTTP proxy or through SOCKS5 (net/http's proxy support), with
// the classification of their errors (refused, timeout, proxy...).
package egress
