package retentionui_test

import (
	"fmt"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"
)

var discard = slog.New(slog.DiscardHandler)

// TestMain checks for leaked goroutines once the shared browser, if any
// test started it, is gone.
func TestMain(m *testing.M) {
	code := m.Run()
	stopBrowser()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
