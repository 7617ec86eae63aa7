package sqlkv_test

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// spinEnv, set to the parent's process id, makes this test binary a load
// generator: it spins one CPU until killed, or until its parent is gone.
const spinEnv = "RETENTION_SQLKV_SPIN"

// loadCPU keeps every CPU of the machine busy until t ends, with one
// process per CPU that spins, so that t runs as on a loaded machine: its
// goroutines, the database servers and the other processes of the host
// wait for a core.
func loadCPU(t testing.TB) {
	t.Helper()
	for range runtime.NumCPU() {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), spinEnv+"="+strconv.Itoa(os.Getpid()), "GOMAXPROCS=1")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}

// spinMain spins when this process is a load generator, and returns
// otherwise.
func spinMain() {
	parent := os.Getenv(spinEnv)
	if parent == "" {
		return
	}
	go func() {
		// An orphan stops: the test was killed before its cleanups ran.
		for range time.Tick(100 * time.Millisecond) {
			if strconv.Itoa(os.Getppid()) != parent {
				os.Exit(0)
			}
		}
	}()
	for n := uint64(0); ; n++ {
		if n%(1<<20) == 0 {
			runtime.Gosched()
		}
	}
}
