module github.com/marksweep/retention

go 1.25.0

require (
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	golang.org/x/time v0.15.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
