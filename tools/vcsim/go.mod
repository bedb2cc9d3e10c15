module example.com/ferry/tools/vcsim

go 1.26.0

require (
	github.com/google/uuid v1.6.0
	github.com/vmware/govmomi v0.56.0
)

require gopkg.in/yaml.v3 v3.0.1 // indirect
