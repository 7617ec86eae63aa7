package pgkv

// ScanSQL returns the statement of k's Scan.
func ScanSQL(k *KV) string { return k.scanSQL }

// SetMaxPrepared sets how many statements pgkv prepares on one connection,
// until the test ends. Tests that call it must not run in parallel.
func SetMaxPrepared(t interface{ Cleanup(func()) }, n int) {
	old := maxPrepared
	maxPrepared = n
	t.Cleanup(func() { maxPrepared = old })
}
