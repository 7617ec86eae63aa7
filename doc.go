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
// # Guarantees
//
//   - At least once: a marker is deleted only after Clear returned nil for
//     it, so every expired entity is cleared at least once, and again after
//     a crash or failed delete between the two steps. Clear must therefore
//     be idempotent.
//   - Strict cutoff: a marker exactly Retention old is kept; Clear never
//     sees an entity before its retention ran out.
//   - A failed or panicking Clear keeps its marker for a later pass; the
//     pass and the loop go on.
//   - Cancelling the context stops a pass promptly and deletes no marker of
//     the page in flight.
//
// # Caveats
//
//   - A sweep owns every key that continues its prefix with a digit. Keys
//     there that are not well-formed markers are deleted as malformed,
//     without Clear. Two sweeps must not share a prefix, nor use prefixes
//     where one extends the other with a digit.
//   - Ids follow ValidateID unless Config.ValidateID says otherwise; an
//     empty id is always refused, since clearing "<entity-prefix>" + "" is
//     rarely what anyone wants.
//   - Without coordination, several processes running the same sweep over
//     one shared store may clear an entity more than once. Set
//     Config.Lease (adapters provide Lockers) so that one replica sweeps at
//     a time; Group runs several sweeps under one lease.
package retention
