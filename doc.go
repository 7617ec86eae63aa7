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
// To watch a sweep in production, set Config.Observer and probe
// Sweep.Backlog. Callers who schedule passes themselves call LeasedPass.
// The guides in the repository's docs folder cover each topic.
//
// # Guarantees
//
//   - At least once: a marker is deleted only after Clear returned nil (or
//     ErrLiveAgain) for it, so Clear must be idempotent.
//   - Never early: a marker exactly Retention old is kept, and MarkerKey
//     rounds the finish time up to a whole millisecond.
//   - A Clear that fails, panics, times out or calls runtime.Goexit keeps
//     its marker, which is tried again after a backoff.
//   - A store call that hangs fails its pass after Config.StoreTimeout.
//   - Cancelling the context stops a pass promptly and deletes no marker of
//     the page in flight.
//
// # Caveats
//
//   - A sweep owns the marker-shaped keys under its prefix: those with a
//     refused id or time are deleted as malformed, without Clear. Other
//     keys under the prefix are foreign and left alone, but a pass steps
//     over them, so keep markers under a prefix of their own. New refuses
//     a prefix another sweep would read as its markers (20 digits and '/'
//     after a separator, as in "t/00000000000000012345/").
//   - Ids follow ValidateID unless Config.ValidateID says otherwise; then
//     write markers with Sweep.MarkerKey or Sweep.Mark. An empty id is
//     always refused.
//   - A Sweep or Group not made by New or NewGroup returns ErrNotConfigured,
//     and a second Run of a running Sweep returns ErrRunning.
//   - A Clear that ignores its context cannot be stopped: Go cannot
//     pre-empt a goroutine, and the page waits for it.
//   - Without coordination, several processes running the same sweep over
//     one shared store may clear an entity more than once. Set
//     Config.Lease (adapters provide Lockers) so that one replica sweeps at
//     a time; Group runs several sweeps under one lease.
package retention
