package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// A CPUMeter returns the CPU time a server's processes have used so far,
// all of them together: the difference of two readings is what the
// server spent in between. On a machine shared with other work the wall
// time of a run swings with the load, while the CPU time each side spends
// per entity barely moves: it is the figure to compare two ways of
// deleting by when the load is high.
type CPUMeter func() (time.Duration, error)

// PGServerCPU returns a CPUMeter of the PostgreSQL server behind pool:
// its postmaster's child processes (backends, WAL writer, checkpointer,
// autovacuum), read from /proc/<pid>/schedstat, so it works only for a
// server on this machine whose /proc entries this process can read. A
// child that exits between two readings takes its time with it:
// autovacuum workers, which come and go, are undercounted.
func PGServerCPU(ctx context.Context, pool *pgxpool.Pool) (CPUMeter, error) {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return nil, err
	}
	postmaster, err := parentOf(backend)
	if err != nil {
		return nil, fmt.Errorf("the server is not on this machine, or its processes cannot be read: %w", err)
	}
	return func() (time.Duration, error) {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return 0, err
		}
		var total time.Duration
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if ppid, err := parentOf(pid); err != nil || ppid != postmaster {
				continue // gone meanwhile, or another process
			}
			if d, err := schedTime(pid); err == nil {
				total += d
			}
		}
		return total, nil
	}, nil
}

// RedisServerCPU returns a CPUMeter of the Redis server of rdb: every
// thread of its process, so it works only for a server on this machine.
func RedisServerCPU(ctx context.Context, rdb *redis.Client) (CPUMeter, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return nil, err
	}
	pid := 0
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid == 0 {
		return nil, errors.New("INFO server names no process_id")
	}
	if _, err := schedTime(pid); err != nil {
		return nil, fmt.Errorf("the server is not on this machine, or its process cannot be read: %w", err)
	}
	return func() (time.Duration, error) {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		if err != nil || len(tasks) == 0 {
			return 0, fmt.Errorf("redis process %d: no threads to read (%v)", pid, err)
		}
		var total time.Duration
		for _, t := range tasks {
			if d, err := readSchedstat(t); err == nil {
				total += d
			}
		}
		return total, nil
	}, nil
}

// clientCPU is the CPU time this process has used so far, every thread.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parentOf returns the parent process id of pid, from /proc/<pid>/stat.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields
	// after it start past the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	return strconv.Atoi(f[1]) // state, then ppid
}

// schedTime returns the CPU time of pid's main thread.
func schedTime(pid int) (time.Duration, error) {
	return readSchedstat(fmt.Sprintf("/proc/%d/schedstat", pid))
}

// readSchedstat reads the first field of a schedstat file: nanoseconds
// spent on a CPU.
func readSchedstat(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("%s: empty", path)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns), err
}
