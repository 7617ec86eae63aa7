module github.com/marksweep/retention/bench/console

// Measures the retentionui console on bbolt and PostgreSQL; not published.
// The core, the adapters and retentionui come from the repository's go.work.

go 1.26.0

require (
	github.com/chromedp/chromedp v0.23.1
	github.com/jackc/pgx/v5 v5.12.0
	github.com/marksweep/retention v0.1.0
	github.com/marksweep/retention/boltkv v0.1.0
	github.com/marksweep/retention/pgkv v0.1.0
	github.com/marksweep/retention/retentionui v0.1.0
	go.etcd.io/bbolt v1.5.0
)

require (
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/marksweep/retention/sqlkv v0.1.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)
