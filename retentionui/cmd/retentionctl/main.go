// Command retentionctl shows what the sweeps of a service do and acts on
// them, through the JSON of the service's retentionui console.
//
//	retentionctl -addr URL status               every sweep's state and backlog
//	retentionctl -addr URL due PREFIX           the due markers, longest overdue first
//	retentionctl -addr URL parked PREFIX        the parked markers
//	retentionctl -addr URL requeue PREFIX ID    put a parked marker back
//	retentionctl -addr URL requeue PREFIX --all put every parked marker back
//	retentionctl -addr URL release PREFIX ID    lift a held marker's hold: due at once
//	retentionctl -addr URL why PREFIX ID        when ID will be cleared, and why not yet
//
// URL is where the console is mounted, such as
// http://127.0.0.1:8080/admin/retention/ (or $RETENTIONCTL_ADDR). It prints
// tables for people, or with -json the console's JSON as it came.
//
// Flags go before the command. An argument that starts with '-' (an id or a
// prefix: the default id rule allows it) must follow "--", which ends the
// flags: retentionctl requeue jobs/done/ -- -all requeues the id "-all",
// and without the "--" that id is refused with this hint. Before "--",
// requeue's --all means every parked marker.
//
// The console has no authentication of its own; the credentials of what
// it is mounted behind go with -user and -password (HTTP basic; the
// password best from $RETENTIONCTL_PASSWORD, kept out of the process list,
// and the user from $RETENTIONCTL_USER), or with -H, which adds a header to
// every request, such as "Authorization: Bearer TOKEN". On a 401 it says
// that credentials are missing (or, when some were sent, not accepted), on
// a 403 from in front of the console that they were refused, and names
// these flags; the console's own 403 (read-only) is shown as it came.
//
// Exit status: 0 on success, 1 when the service refused (any answer but
// 200, such as 409 for an id that is not parked, or not held, or 401 for
// missing credentials) or could not be reached, 2 on a usage error. Errors go to
// stderr; with -json each is also written to stdout as a
// retentionui.ErrorBody: the console's own when it refused, one with the
// answer's HTTP status when something in front of it did, and status 0
// when no refusal came (a usage error, a service not reached, a 200 whose
// body is not the console's JSON).
package main

import (
	"context"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
