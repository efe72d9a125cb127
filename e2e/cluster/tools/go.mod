// Pins the command-line tools the e2e suite and CI use, so that they build from the Go module proxy with the
// committed go.sum (no checksum database needed): actionlint (workflow lint), helm (chart tests), kind.
module isthmus.dev/e2e/cluster/tools

go 1.26.0

require (
	github.com/rhysd/actionlint v1.7.12
	helm.sh/helm/v3 v3.22.0
	sigs.k8s.io/kind v0.33.0
)
