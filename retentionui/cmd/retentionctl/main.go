// Command retentionctl shows what the sweeps of a service do and acts on
// them, through the JSON of the service's retentionui console.
//
//	retentionctl -addr URL status               every sweep's state and backlog
//	retentionctl -addr URL due PREFIX           the due markers, longest overdue first
//	retentionctl -addr URL parked PREFIX        the parked markers
//	retentionctl -addr URL requeue PREFIX ID    put a parked marker back
//	retentionctl -addr URL requeue PREFIX --all put every parked marker back
//	retentionctl -addr URL why PREFIX ID        when ID will be cleared, and why not yet
//
// URL is where the console is mounted, such as
// http://127.0.0.1:8080/admin/retention/ (or $RETENTIONCTL_ADDR). It prints
// tables for people, or with -json the console's JSON as it came. -H adds a
// header to every request, such as the credentials of the authentication
// the console is mounted behind.
//
// Exit status: 0 on success, 1 when the service refused (any answer but
// 200, such as 409 for an id that is not parked) or could not be reached,
// 2 on a usage error.
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
