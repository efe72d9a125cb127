//go:build tools

// Package tools only records the build's import, so that go mod tidy keeps cmd/prometheus's dependencies.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
