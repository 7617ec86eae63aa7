module github.com/marksweep/retention/tools

// Release and CI tooling: not published, not imported by any module. Run it
// with GOWORK=off from this directory (scripts/modtool does), so that it works
// even while the workspace itself is broken.

go 1.26.0

require golang.org/x/mod v0.42.0
