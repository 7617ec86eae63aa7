package leasetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recordTB records the errors and logs of the sharded proof's checks, to
// tell that they fail what they must.
type recordTB struct {
	testing.TB
	errors, logs []string
}

func (r *recordTB) Helper() {}

func (r *recordTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recordTB) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// shardLogs writes a log per process, each line "<ms> <event> <fields>"
// with ms after at, as a replica's eventLog writes it in nanoseconds, and
// returns a shardFleet of those processes.
func shardLogs(t *testing.T, tb testing.TB, at time.Time, logs ...[]string) *shardFleet {
	dir := t.TempDir()
	f := &shardFleet{t: tb, dir: dir}
	for i, lines := range logs {
		var b strings.Builder
		for _, l := range lines {
			ms, rest, _ := strings.Cut(l, " ")
			n, err := strconv.Atoi(ms)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%d %s\n", at.Add(time.Duration(n)*time.Millisecond).UnixNano(), rest)
		}
		p := &shardProc{process: fmt.Sprintf("p%d", i), log: filepath.Join(dir, fmt.Sprintf("p%d.log", i))}
		if err := os.WriteFile(p.log, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		f.procs = append(f.procs, p)
	}
	return f
}

// events returns "<ms> <event> <shard>" lines for shards from to to-1.
func events(ms int, event string, from, to int) []string {
	var out []string
	for s := from; s < to; s++ {
		out = append(out, fmt.Sprintf("%d %s %d", ms, event, s))
	}
	return out
}

// TestShardOwnersFollowTheLeaseEvents replays the logs of a killed, a
// stopped and a live replica: the shards belong to the last process that
// acquired them, a loss logged late (by a process resumed after the
// takeover) takes nothing from the new holder, and a line cut short by
// SIGKILL is skipped.
func TestShardOwnersFollowTheLeaseEvents(t *testing.T) {
	at := time.Now().Add(-time.Minute)
	killed := append(events(10, "acquired", 0, 8), events(50, "cleared", 0, 1)...)
	stopped := append(events(20, "acquired", 8, 16), events(900, "lost", 8, 16)...)
	live := append(events(300, "acquired", 0, 8), events(310, "acquired", 8, 16)...)
	live = append(live, "950 released 15")
	stopped = append(stopped, "951 acquired 15")
	f := shardLogs(t, t, at, killed, stopped, live)
	// A line SIGKILL cut short.
	file, err := os.OpenFile(f.procs[0].log, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := file.WriteString(strconv.FormatInt(at.Add(time.Second).UnixNano(), 10) + " acq"); err != nil {
		t.Fatal(err)
	}
	file.Close()

	owners := f.owners()
	for s, o := range owners {
		want := 2
		if s == 15 {
			want = 1
		}
		if o != want {
			t.Errorf("owners()[%d] = %d, want %d (owners %v)", s, o, want, owners)
		}
	}
	if ok, counts := balanced(owners, []int{1, 2}); ok {
		t.Errorf("balanced(%v, [1 2]) = true %v, want false: 1 and 15 are not within one of 8", owners, counts)
	}
}

func TestShardBalanced(t *testing.T) {
	owner := func(counts ...int) []int {
		var out []int
		for p, n := range counts {
			for range n {
				out = append(out, p)
			}
		}
		for len(out) < shardCount {
			out = append(out, -1)
		}
		return out
	}
	tests := []struct {
		name   string
		owners []int
		procs  []int
		want   bool
	}{
		{"4 each", owner(4, 4, 4, 4), []int{0, 1, 2, 3}, true},
		{"5, 5 and 6", owner(5, 5, 6), []int{0, 1, 2}, true},
		{"8 each", owner(8, 8), []int{0, 1}, true},
		{"one shard free", owner(4, 4, 4, 3), []int{0, 1, 2, 3}, false},
		{"one held by a process not named", owner(4, 4, 4, 4), []int{0, 1, 2}, false},
		{"3, 5 and 8 over 3", owner(3, 5, 8), []int{0, 1, 2}, false},
		{"6 and 10", owner(6, 10), []int{0, 1}, false},
	}
	for _, tt := range tests {
		if got, counts := balanced(tt.owners, tt.procs); got != tt.want {
			t.Errorf("%s: balanced(%v, %v) = %v %v, want %v", tt.name, tt.owners, tt.procs, got, counts, tt.want)
		}
	}
}

// TestShardCheckTakenMeasuresFromTheStrike measures the takeover of the
// shards of two processes struck at once by a third, and fails it against
// a bound it misses; acquisitions by the struck processes do not count.
func TestShardCheckTakenMeasuresFromTheStrike(t *testing.T) {
	at := time.Now().Add(-time.Minute)
	f := shardLogs(t, t, at,
		events(10, "acquired", 0, 8),
		append(events(20, "acquired", 8, 16), "2000 acquired 0"),
		append(events(2300, "acquired", 0, 8), events(2400, "acquired", 8, 16)...),
	)
	struck := at.Add(100 * time.Millisecond)
	rec := &recordTB{TB: t}
	f.t = rec
	f.checkTaken("struck", []int{0, 1, 8, 15}, struck, 3*time.Second, 0, 1)
	if len(rec.errors) != 0 {
		t.Errorf("checkTaken within the bound: errors %q", rec.errors)
	}
	if want := "its shards [0 1 8 15] taken after [2.2s 2.2s 2.3s 2.3s] (at most 2.3s, bound 3s)"; len(rec.logs) != 1 || !strings.Contains(rec.logs[0], want) {
		t.Errorf("checkTaken logged %q, want %q", rec.logs, want)
	}

	rec = &recordTB{TB: t}
	f.t = rec
	f.checkTaken("struck", []int{0, 8}, struck, 2250*time.Millisecond, 0, 1)
	if len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "shard 8 taken after 2.3s, want within TTL + Interval (2.25s)") {
		t.Errorf("checkTaken past the bound: errors %q, want one for shard 8", rec.errors)
	}
}

// TestShardCheckClearsCatches checks the clears as the store recorded
// them: an entity never cleared and one cleared twice, by two processes
// or by one, fail the proof.
func TestShardCheckClearsCatches(t *testing.T) {
	tests := []struct {
		name       string
		clears     map[string][]string
		wantErrors []string
	}{
		{"each once", map[string][]string{"a": {"p0"}, "b": {"p1"}, "c": {"p1"}}, nil},
		{"one lost", map[string][]string{"a": {"p0"}, "c": {"p1"}},
			[]string{"1 entities never cleared, want 0: [b]"}},
		{"twice by two", map[string][]string{"a": {"p0", "p1"}, "b": {"p1"}, "c": {"p1"}},
			[]string{"1 entities cleared more than once (1 of them by two processes), want 0: [a]"}},
		{"twice by one", map[string][]string{"a": {"p0"}, "b": {"p1"}, "c": {"p1", "p1"}},
			[]string{"1 entities cleared more than once (0 of them by two processes), want 0: [c]"}},
	}
	for _, tt := range tests {
		rec := &recordTB{TB: t}
		f := shardLogs(t, rec, time.Now(), nil, nil)
		f.e.Clears = func(context.Context, string, []string) (map[string][]string, error) { return tt.clears, nil }
		f.checkClears([]string{"a", "b", "c"})
		if fmt.Sprint(rec.errors) != fmt.Sprint(tt.wantErrors) {
			t.Errorf("%s: checkClears errors %q, want %q", tt.name, rec.errors, tt.wantErrors)
		}
	}
}

func TestRunPattern(t *testing.T) {
	tests := []struct{ name, want string }{
		{"TestX", "^TestX$"},
		{"TestX/shard_0_of_16", "^TestX$/^shard_0_of_16$"},
		{"TestX/a.b/c+d", `^TestX$/^a\.b$/^c\+d$`},
	}
	for _, tt := range tests {
		if got := runPattern(tt.name); got != tt.want {
			t.Errorf("runPattern(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}
