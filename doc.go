// Package retention deletes an entity's state some time after the entity
// finished, by sweeping terminal markers.
//
// # Basics
//
// When a service finishes an entity (a workflow run, a job, an upload) it
// writes a marker key "<prefix><ts>/<id>" in the same transaction that
// records the outcome; ts is the finish time in Unix milliseconds, padded to
// 20 digits so that byte order is time order (see MarkerKey). A Sweep pairs
// the prefix with a retention window and a Clear callback. Each Pass scans
// the markers oldest first, in pages, through the small KV interface; for
// every marker older than the retention it calls Clear(id) and then deletes
// the marker, and it stops at the first marker that has not expired, so a
// pass with nothing to do costs two small reads however many markers wait.
//
// Most services call Run in a goroutine: it passes at once, then sleeps
// until the next marker falls due (at most Config.Interval). Tests call Pass
// directly with a ManualClock.
//
// MemKV is the in-memory store; adapters for persistent engines live in
// their own modules beside this one.
//
// To watch a sweep in production, set Config.Observer (the retentionprom
// and retentionotel modules export Prometheus and OpenTelemetry metrics)
// and probe Sweep.Backlog, which tells in a few reads how far behind the
// sweep is. Callers who schedule passes themselves call LeasedPass: one
// pass under the lease, as Run makes it.
//
// # Guarantees
//
//   - At least once: a marker is deleted only after Clear returned nil (or
//     ErrLiveAgain) for it, so every expired entity is cleared at least
//     once, and again after a crash or failed delete between the two steps.
//     Clear must therefore be idempotent.
//   - Never early: a marker exactly Retention old is kept, and MarkerKey
//     rounds the finish time up to a whole millisecond, so Clear never sees
//     an entity before its retention ran out.
//   - A Clear that fails, panics, times out (Config.ClearTimeout) or calls
//     runtime.Goexit keeps its marker, which is tried again after a delay
//     that doubles from Config.RetryDelay to Config.MaxRetryDelay; the pass
//     and the loop go on.
//   - A store call that hangs fails its pass after Config.StoreTimeout, and
//     Run retries; no wait of Run overflows or drops to zero in a loop.
//   - Cancelling the context stops a pass promptly and deletes no marker of
//     the page in flight.
//
// # Caveats
//
//   - A sweep owns the marker-shaped keys under its prefix: the prefix, 20
//     digits, '/' and an id. Those with a refused id or a time past the year
//     9999 are deleted as malformed, without Clear. Other keys under the
//     prefix are foreign and left alone, but a pass steps over them, so keep
//     markers under a prefix of their own.
//   - Ids follow ValidateID (1 to MaxIDLen bytes of A-Z a-z 0-9 _ -)
//     unless Config.ValidateID says otherwise; then write markers with
//     Sweep.MarkerKey or Sweep.Mark, which check ids by the sweep's rule.
//     An empty id is always refused, since clearing "<entity-prefix>" + ""
//     is rarely what anyone wants.
//   - A Sweep or Group not made by New or NewGroup returns ErrNotConfigured,
//     and a second Run of a running Sweep returns ErrRunning.
//   - A Clear that ignores its context cannot be stopped: Go cannot
//     pre-empt a goroutine, and the page waits for it.
//   - Without coordination, several processes running the same sweep over
//     one shared store may clear an entity more than once. Set
//     Config.Lease (adapters provide Lockers) so that one replica sweeps at
//     a time; Group runs several sweeps under one lease.
package retention
