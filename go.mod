module github.com/marksweep/retention

go 1.25.0

require golang.org/x/sync v0.22.0
