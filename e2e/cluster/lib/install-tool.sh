#!/usr/bin/env bash
# Builds a pinned tool from ../tools (go.mod + go.sum; Prometheus from ../prometheus, a module of its own) into the
# cache, once; prints its path.
# Usage: install-tool.sh actionlint|helm|kind|prometheus
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../tools" && pwd)
CACHE=${ISTHMUS_CACHE:-$HOME/.cache/isthmus}
tags=
case ${1:-} in
  actionlint) mod=github.com/rhysd/actionlint pkg=github.com/rhysd/actionlint/cmd/actionlint ;;
  helm) mod=helm.sh/helm/v3 pkg=helm.sh/helm/v3/cmd/helm ;;
  kind) mod=sigs.k8s.io/kind pkg=sigs.k8s.io/kind ;;
  # Only Kubernetes service discovery (the build tags of its plugins/), and no web UI assets (the builtinassets
  # tag): the HTTP API is what make prometheus-check reads.
  prometheus) mod=github.com/prometheus/prometheus pkg=github.com/prometheus/prometheus/cmd/prometheus
    HERE=$(cd "$(dirname "$0")/../prometheus" && pwd) tags=remove_all_sd,enable_kubernetes_sd ;;
  *) echo "usage: $0 actionlint|helm|kind|prometheus" >&2; exit 2 ;;
esac
version=$(awk -v m="$mod" '$1 == m {print $2} $1 == "require" && $2 == m {print $3}' "$HERE/go.mod")
[ -n "$version" ] || { echo "install-tool: $mod is not pinned in $HERE/go.mod" >&2; exit 1; }
out=$CACHE/bin/$1-$version
if [ ! -x "$out" ]; then
  command -v go >/dev/null || { echo "install-tool: Go is needed to build $1" >&2; exit 1; }
  export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
  export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build
  mkdir -p "$CACHE/bin"
  ldflags="-s -w"
  case $1 in
    # Release builds stamp the version; without it `helm version` reports only the module's major.minor.
    helm) ldflags="$ldflags -X helm.sh/helm/v3/internal/version.version=$version" ;;
    actionlint) ldflags="$ldflags -X github.com/rhysd/actionlint.version=$version" ;;
    prometheus) ldflags="$ldflags -X github.com/prometheus/common/version.Version=${version#v}" ;;
  esac
  echo "install-tool: building $1 $version" >&2
  (cd "$HERE" && nice -n 10 go build -tags "$tags" -ldflags "$ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
fi
echo "$out"
