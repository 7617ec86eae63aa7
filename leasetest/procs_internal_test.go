package leasetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// memRuns is a RunClearer over a MemKV that counts its runs; fenced marks
// the view a memFencer made of it.
type memRuns struct {
	*retention.MemKV
	runs   *atomic.Int64
	fenced bool
}

func (m *memRuns) ClearAndDelete(ctx context.Context, _ []string, keys [][]byte) error {
	return m.Delete(ctx, keys...)
}

func (m *memRuns) ClearRun(ctx context.Context, _ string, from, end []byte, limit int) ([][]byte, error) {
	keys, err := m.Scan(ctx, from, end, limit)
	if err != nil {
		return nil, err
	}
	m.runs.Add(1)
	return keys, m.Delete(ctx, keys...)
}

func (m *memRuns) RunStore() retention.RunClearer { return m }

// embedsRuns is a wrapper that embeds a RunClearer without declaring its
// runs: the sweep reads it page by page.
type embedsRuns struct{ *memRuns }

// memFencer fences a memRuns by marking a copy of it.
type memFencer struct{}

func (memFencer) Fence(kv retention.KV) (retention.KV, bool) {
	m, ok := kv.(*memRuns)
	if !ok {
		return nil, false
	}
	view := *m
	view.fenced = true
	return &view, true
}

// newLogLocker returns a loggingLocker logging to a file of t's, and a
// function that reads the log's lines.
func newLogLocker(t *testing.T) (*loggingLocker, func() []string) {
	path := filepath.Join(t.TempDir(), "replica.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	lines := func() []string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	return &loggingLocker{log: &eventLog{w: f}}, lines
}

func newMemRuns(t *testing.T, markers int) *memRuns {
	m := &memRuns{MemKV: retention.NewMemKV(), runs: new(atomic.Int64)}
	at := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range markers {
		if err := retention.Mark(context.Background(), m, procPrefix, fmt.Sprintf("m%05d", i), at.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// sweepOnce makes a pass over kv configured as a replica's over a
// ClearDeleter.
func sweepOnce(t *testing.T, kv retention.KV) retention.Stats {
	s, err := retention.New(kv, retention.Config{Prefix: procPrefix, Retention: time.Millisecond, PageSize: procPageSize, BatchSize: procPageSize})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Pass(context.Background())
	if err != nil {
		t.Fatalf("Pass() = %v", err)
	}
	return st
}

// TestLoggedRunClearerTakesRuns: a replica's store that is a RunClearer
// is cleared by runs through the logging wrapper, each logged as a
// deletion of up to its limit whose delete-ok says how many it deleted.
func TestLoggedRunClearerTakesRuns(t *testing.T) {
	const markers = 35
	rc := newMemRuns(t, markers)
	l, lines := newLogLocker(t)
	kv := logKV(rc, l, 0)
	if _, ok := kv.(retention.RunClearer); !ok {
		t.Fatalf("logKV(%T) = %T, want a RunClearer", rc, kv)
	}
	sweepOnce(t, kv)
	if got := rc.runs.Load(); got != 4 {
		t.Errorf("ClearRun calls = %d, want 4 (35 markers in runs of 10)", got)
	}
	if n := rc.Len(); n != 0 {
		t.Errorf("%d markers left, want 0", n)
	}
	var starts, deleted int
	for _, line := range lines() {
		f := strings.Fields(line)
		switch f[1] {
		case "delete-start":
			starts++
			if len(f) != 6 || f[4] != "10" || f[5] != opRun {
				t.Errorf("log line %q, want delete-start <op> <lease> 10 run", line)
			}
		case "delete-ok":
			var n int
			fmt.Sscan(f[4], &n)
			deleted += n
		}
	}
	if starts != 4 || deleted != markers {
		t.Errorf("log: %d deletions started, %d markers deleted; want 4, %d", starts, deleted, markers)
	}
}

// TestLoggedWrapperOfRunClearerReadsPages: a store the sweep would read
// page by page, a wrapper that embeds a RunClearer, stays read page by
// page through the logging wrapper.
func TestLoggedWrapperOfRunClearerReadsPages(t *testing.T) {
	rc := newMemRuns(t, 15)
	l, lines := newLogLocker(t)
	kv := logKV(embedsRuns{rc}, l, 0)
	if _, ok := kv.(*loggingClearDeleter); !ok {
		t.Fatalf("logKV(embedsRuns) = %T, want a *loggingClearDeleter", kv)
	}
	sweepOnce(t, kv)
	if got := rc.runs.Load(); got != 0 {
		t.Errorf("ClearRun calls = %d, want 0", got)
	}
	for _, line := range lines() {
		if f := strings.Fields(line); f[1] == "delete-start" && f[5] != opClear {
			t.Errorf("log line %q, want a clear", line)
		}
	}
}

// TestFencedViewOfLoggedRunClearerTakesRuns: the lease's fence reaches
// the store inside the logging wrapper, and the view it returns is
// wrapped again, runs and all, logged under that lease.
func TestFencedViewOfLoggedRunClearerTakesRuns(t *testing.T) {
	rc := newMemRuns(t, 20)
	l, lines := newLogLocker(t)
	lease := fencingLoggingLease{loggingLease: loggingLease{n: 7, locker: l}, f: memFencer{}}
	view, ok := lease.Fence(logKV(rc, l, 0))
	if !ok {
		t.Fatal("Fence(logKV(memRuns)) cannot fence, want a view")
	}
	lrc, ok := view.(*loggingRunClearer)
	if !ok {
		t.Fatalf("Fence(logKV(memRuns)) = %T, want a *loggingRunClearer", view)
	}
	if inner, _ := lrc.rc.(*memRuns); inner == nil || !inner.fenced || lrc.lease != 7 {
		t.Fatalf("Fence(logKV(memRuns)) wraps %T (lease %d), want memFencer's view under lease 7", lrc.rc, lrc.lease)
	}
	sweepOnce(t, view)
	if got := rc.runs.Load(); got != 3 {
		t.Errorf("ClearRun calls = %d, want 3 (two full runs of 10, then an empty one)", got)
	}
	for _, line := range lines() {
		if f := strings.Fields(line); f[1] == "delete-start" && (f[3] != "7" || f[5] != opRun) {
			t.Errorf("log line %q, want a run under lease 7", line)
		}
	}
}

// TestHeldDeletionStartsAfterGo: a replica asked to hold (envHold) holds
// its next deletion before it starts, says so, and starts it only on the
// test's word, with a context the lease's loss no longer cancels; the
// request is taken once.
func TestHeldDeletionStartsAfterGo(t *testing.T) {
	rc := newMemRuns(t, 20)
	l, lines := newLogLocker(t)
	l.hold = filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(l.hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	kv := logKV(rc, l, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kv.Delete(ctx, []byte("a")) }()
	for !exists(l.hold + ".held") {
		time.Sleep(time.Millisecond)
	}
	for _, line := range lines() {
		if f := strings.Fields(line); f[1] == "delete-start" {
			t.Errorf("log line %q before the word to go, want none", line)
		}
	}
	cancel() // the pass learns of the loss during the hold
	if err := os.WriteFile(l.hold+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("held Delete = %v, want nil: past the hold only the store may refuse it", err)
	}
	if err := kv.Delete(context.Background(), []byte("b")); err != nil {
		t.Errorf("next Delete = %v, want nil", err)
	}
	var got []string
	for _, line := range lines() {
		got = append(got, strings.Fields(line)[1])
	}
	want := "hold go delete-start delete-ok delete-start delete-ok"
	if strings.Join(got, " ") != want {
		t.Errorf("log events %q, want %q", got, want)
	}
	if exists(l.hold + ".go") {
		t.Error("the word to go is left, want it taken")
	}
}
