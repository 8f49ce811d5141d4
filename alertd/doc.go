// Package alertd is the alerting component: it checks the rules of the
// config file's alerts section (a task in NEEDS_REVIEW, a task running too
// long, a route down, a resource in FAULT, no scheduler leader, auditd
// lagging), publishes each alert as an event on gantry.audit.alert.<kind>
// and delivers it to webhooks (a signed JSON POST, retried with backoff)
// and by email (SMTP with STARTTLS and authentication), at most one alert
// per rule and subject per window.
//
// Like every component it talks to the others only through subjects and
// buckets; 'gantry run' includes it and 'gantry alertd' runs it alone.
package alertd
