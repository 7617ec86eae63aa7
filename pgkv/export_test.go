package pgkv

// ScanSQL returns the statement of k's Scan.
func ScanSQL(k *KV) string { return k.scanSQL }
