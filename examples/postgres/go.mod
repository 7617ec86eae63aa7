module github.com/marksweep/retention/examples/postgres

go 1.26.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/marksweep/retention v0.1.0
	github.com/marksweep/retention/pgkv v0.1.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/marksweep/retention/sqlkv v0.1.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)
