#!/usr/bin/env bash
# make examples-validate: every examples/*.yaml against a real Kubernetes 1.34 API server with the isthmus CRDs.
#   - static: each file starts with a comment saying what to expect; every NetworkLink's selectors pick pods of a
#     workload in the same file, and so does every region of a NetworkTopology (an example that selects nothing
#     would apply but show nothing);
#   - the CRD (charts/isthmus/crds, = crds/networklink.yaml) is installed on a control-plane-only cluster, the
#     examples' Namespaces are created, and each file passes `kubectl apply --dry-run=server --validate=strict`
#     (OpenAPI schema, CEL rules, unknown fields refused);
#   - a broken copy of an example (a bandwidth in mbps) is refused with the field named, proving the CRD checked.
# Environment: ISTHMUS_CLUSTER_NAME (default examples-validate), ISTHMUS_K8S_VERSION (the cluster's Kubernetes,
# default v1.34.12; make min-k8s runs this on v1.32.13).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export ISTHMUS_CLUSTER_NAME=${ISTHMUS_CLUSTER_NAME:-examples-validate}
work=$(mktemp -d /tmp/isthmus-examples.XXXXXX)
cluster_up=
cleanup() {
  [ -z "$cluster_up" ] || e2e/cluster/cluster down >/dev/null 2>&1 || echo "examples-validate: cluster down failed" >&2
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "examples-validate: FAIL: $*" >&2; exit 1; }

examples=(examples/*.yaml)
[ ${#examples[@]} -ge 6 ] || fail "expected at least 6 examples, found ${#examples[@]}"
# A real cluster pulls the probe image the release publishes: ghcr.io/<owner in Cargo.toml>/isthmus-probe at the
# chart's appVersion (the version `helm install` of that release runs); local clusters get it renamed.
owner=$(sed -n 's|^repository *= *"https://github.com/\([^/]*\)/.*|\1|p' Cargo.toml)
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/isthmus/Chart.yaml)
[ -n "$owner" ] && [ -n "$app_version" ] || fail "cannot read the repository owner (Cargo.toml) or appVersion (Chart.yaml)"
PROBE_IMAGE="ghcr.io/${owner,,}/isthmus-probe:$app_version" python3 - "${examples[@]}" <<'PY' || fail "static checks"
import os, subprocess, sys, yaml
bad = False
probe = os.environ["PROBE_IMAGE"]
def images(docs):
    return [(d["metadata"]["name"], c["image"]) for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
            for c in d["spec"]["template"]["spec"].get("initContainers", []) + d["spec"]["template"]["spec"]["containers"]]
def matches(sel, labels):
    return all(labels.get(k) == v for k, v in (sel or {}).get("matchLabels", {}).items()) and \
        all((e["operator"] == "In" and labels.get(e["key"]) in e["values"]) or
            (e["operator"] == "NotIn" and labels.get(e["key"]) not in e["values"]) or
            (e["operator"] == "Exists" and e["key"] in labels) or
            (e["operator"] == "DoesNotExist" and e["key"] not in labels)
            for e in (sel or {}).get("matchExpressions", []))
for path in sys.argv[1:]:
    text = open(path).read()
    if not text.startswith("#") or "expect" not in text.split("apiVersion:")[0]:
        print(f"{path}: must start with a comment saying what to expect when measured"); bad = True
    docs = [d for d in yaml.safe_load_all(text) if d]
    pods = [(d["metadata"]["namespace"], d["spec"]["template"]["metadata"]["labels"])
            for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
    links = [d for d in docs if d["kind"] == "NetworkLink"]
    topologies = [d for d in docs if d["kind"] == "NetworkTopology"]
    if not links and not topologies:
        print(f"{path}: no NetworkLink or NetworkTopology"); bad = True
    for t in topologies:
        ns, spec = t["metadata"]["namespace"], t["spec"]
        for r in spec["regions"]:
            sel = r.get("podSelector") or {"matchLabels": {spec["regionLabel"]: r["name"]}}
            if not any(pns == ns and matches(sel, labels) for pns, labels in pods):
                print(f"{path}: NetworkTopology {t['metadata']['name']}: region {r['name']} has no workload in the file"); bad = True
    for l in links:
        ns = l["metadata"]["namespace"]
        for side in ("from", "to"):
            sel = l["spec"][side].get("podSelector")
            if sel is None:
                continue
            if not any(pns == ns and matches(sel, labels) for pns, labels in pods):
                print(f"{path}: NetworkLink {l['metadata']['name']}: spec.{side}.podSelector selects no workload in the file"); bad = True
    for name, image in images(docs):
        if image != probe:
            print(f"{path}: {name}: image {image} is not the release's probe image {probe}"); bad = True
    local = subprocess.run(["examples/for-local-cluster", path], capture_output=True, text=True, check=True).stdout
    renamed = [i for _, i in images([d for d in yaml.safe_load_all(local) if d])]
    if not renamed or any(not i.startswith("localhost/isthmus-probe:") for i in renamed):
        print(f"{path}: examples/for-local-cluster left {renamed}"); bad = True
    print(f"examples-validate: {path}: {len(links)} NetworkLink(s), {len(topologies)} NetworkTopology(s), {len(pods)} workload(s)")
sys.exit(1 if bad else 0)
PY

cmp -s crds/networklink.yaml charts/isthmus/crds/networklink.yaml ||
  echo "examples-validate: note: charts/isthmus/crds/networklink.yaml differs from crds/networklink.yaml (make chart-lint fails on this); using the chart's copy"
cluster_up=1
e2e/cluster/cluster up --control-plane-only >"$work/up.log" 2>&1 || { tail -20 "$work/up.log"; fail "cluster up"; }
kc() { e2e/cluster/cluster kubectl "$@"; }
kc apply --server-side -f charts/isthmus/crds/ >/dev/null
kc wait --for condition=Established crd/networklinks.isthmus.dev crd/networktopologies.isthmus.dev --timeout=60s >/dev/null
for f in "${examples[@]}"; do
  # Namespaces for real (a dry-run Namespace does not exist for the objects after it), the rest as a dry run.
  python3 -c 'import sys,yaml; [print(d["metadata"]["name"]) for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"]=="Namespace"]' "$f" |
    while read -r ns; do kc get namespace "$ns" >/dev/null 2>&1 || kc create namespace "$ns" >/dev/null; done
  kc apply --dry-run=server --validate=strict -f "$f" >"$work/out" 2>&1 || { cat "$work/out"; fail "$f refused by the API server"; }
  echo "examples-validate: $f: $(grep -c 'networklink.isthmus.dev/' "$work/out") NetworkLink(s), $(grep -c 'networktopology.isthmus.dev/' "$work/out") NetworkTopology(s), $(grep -c . "$work/out") objects accepted (server dry run)"
done

# The dry run really checks objects against the CRDs: a broken copy must be refused, naming the field.
refused() { # FILE FROM TO FIELD: FILE with FROM replaced by TO must be refused by the API server, naming FIELD
  local file=$1 from=$2 to=$3 field=$4
  sed "s/$from/$to/" "$file" >"$work/broken.yaml"
  grep -qF "$to" "$work/broken.yaml" || fail "could not make the broken copy of $file"
  if kc apply --dry-run=server --validate=strict -f "$work/broken.yaml" >"$work/out" 2>&1; then
    fail "$file with $to was accepted"
  fi
  grep -qF "$field" "$work/out" || { cat "$work/out"; fail "the refusal of $to does not name $field"; }
  echo "examples-validate: a broken copy ($to) is refused: $(grep -F "$field" "$work/out" | head -1 | cut -c1-160)"
}
refused examples/bandwidth-only.yaml 'bandwidth: 50Mbit' 'bandwidth: 50mbps' 'spec.impairment.bandwidth'
refused examples/five-regions.yaml 'datasetRegion: japaneast' 'datasetRegion: japan-east' 'spec.regions[3].datasetRegion'
echo "examples-validate: all ${#examples[@]} examples valid"
