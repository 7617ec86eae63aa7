module github.com/marksweep/retention/examples/inspect

go 1.25.0

require (
	github.com/marksweep/retention v0.1.0
	github.com/marksweep/retention/boltkv v0.1.0
	go.etcd.io/bbolt v1.5.0
)

require (
	golang.org/x/sys v0.45.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)
