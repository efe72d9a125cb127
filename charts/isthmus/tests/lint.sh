#!/usr/bin/env bash
# make chart-lint: checks of charts/isthmus without nodes.
#   1. charts/isthmus/crds/networklink.yaml and networktopology.yaml are byte-identical to the generated crds/;
#   2. helm lint --strict and helm template for several value sets; static checks of the rendered objects
#      (no RBAC wildcards, the operator's and the agent's exact rules, the agent's exact capabilities, non-root
#      operator, matching identities, both pods on Linux nodes by default, no rendered Secret holding a CA key —
#      and that check refuses one that does);
#   3. values.schema.json refuses bad values, naming the field;
#   3b. every value is described once, by its `# --` comment in values.yaml: values.schema.json's descriptions and
#      README.md's values table equal it, every schema property has a description, and the templates read only
#      values values.yaml declares (tests/values_doc.py --check; a copy with one description altered must fail);
#   4. a control-plane-only Kubernetes 1.34 cluster (ISTHMUS_K8S_VERSION another): every rendered object passes
#      `kubectl apply --dry-run=server`;
#      a real `helm install` + `helm upgrade`: no private key in Helm's release records;
#   5. (with 7) the real operator creates the CA, publishes the bundle, denies forged agent certificate requests
#      naming the failed check and signs a genuine one; the real agent serves the certificate the operator signed
#      for its node and accepts only the operator's identity (tests/tls_interop.py);
#   6. the uninstall hook's command (`isthmus-operator uninstall` with the rendered args), impersonating the hook's
#      ServiceAccount with exactly its RBAC: times out naming the links whose finalizer stays, succeeds once gone;
#   7. the real operator binary, impersonating its ServiceAccount with the chart's environment, gets
#      ready, takes its Lease, adds/removes its finalizer, writes status and a gated pod's readiness condition,
#      with no forbidden request.
# Environment: ISTHMUS_OPERATOR_BIN (default: `cargo build -p isthmus-operator`, this tree's debug binary), ISTHMUS_CRD (the generated CRD, default crds/networklink.yaml), ISTHMUS_CLUSTER_NAME (default chart-lint), ISTHMUS_AGENT_BIN (default: this tree's debug binary, built),
# CHART_LINT_SKIP_CLUSTER=1 to run only steps 1-3b; CHART_LINT_SERVER_ONLY=1 to run only steps 1, 2's rendering and
# 4 (make min-k8s: what depends on the API server's version), ISTHMUS_K8S_VERSION (that version, default v1.34.12).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
CHART=$ROOT/charts/isthmus
cd "$ROOT"
HELM=$(e2e/cluster/lib/install-tool.sh helm)
# the rendered-object checks read YAML with PyYAML, in whichever python3 is first on PATH
python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml >&2 ||
  { echo "chart-lint: PyYAML is missing and pip could not install it" >&2; exit 1; }
# helm renders for the version it is checked against (Capabilities.KubeVersion), the minor's .0 as helm names it.
k8s_version=${ISTHMUS_K8S_VERSION:-v1.34.12}
k8s_minor=${k8s_version#v}
k8s_minor=${k8s_minor%.*}
KUBE_VERSION=$k8s_minor.0
server_only=${CHART_LINT_SERVER_ONLY:-}
work=$(mktemp -d /tmp/isthmus-chart-lint.XXXXXX)
agent_pid=
cluster_up=
export ISTHMUS_CLUSTER_NAME=${ISTHMUS_CLUSTER_NAME:-chart-lint}
cleanup() {
  [ -z "$agent_pid" ] || kill "$agent_pid" 2>/dev/null || true
  [ -z "$cluster_up" ] || e2e/cluster/cluster down >/dev/null 2>&1 || echo "chart-lint: cluster down failed" >&2
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "chart-lint: FAIL: $*" >&2; exit 1; }
step() { echo "chart-lint: $*"; }

# ---- 1. the CRD copy
crd=${ISTHMUS_CRD:-crds/networklink.yaml}
[ -s "$crd" ] || fail "$crd is empty or missing (regenerate: cargo run -p isthmus-operator --bin crdgen > crds/networklink.yaml)"
cmp -s "$crd" "$CHART/crds/networklink.yaml" ||
  fail "charts/isthmus/crds/networklink.yaml differs from $crd: cp crds/networklink.yaml charts/isthmus/crds/"
cmp -s crds/networktopology.yaml "$CHART/crds/networktopology.yaml" ||
  fail "charts/isthmus/crds/networktopology.yaml differs from crds/networktopology.yaml: cp crds/networktopology.yaml charts/isthmus/crds/"
step "CRD copy identical to $crd"

# ---- 2. lint and render the value variants
cat > "$work/tolerations.yaml" <<'VALUES'
agent:
  tolerations:
    - {key: dedicated, operator: Equal, value: chaos, effect: NoSchedule}
    - {key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}
  nodeSelector: {kubernetes.io/os: linux}
  cgroupFilter: /$(NODE_NAME)/
  netnsMountPropagation: HostToContainer
  apiPort: 19443
  healthPort: 19464
operator:
  tolerations:
    - {key: dedicated, operator: Equal, value: chaos, effect: NoSchedule}
VALUES
variants=(
  "default|isthmus|isthmus-system|"
  "replicas2|isthmus|isthmus-system|--set operator.replicas=2"
  "tolerations|chaos|chaos-tools|-f $work/tolerations.yaml"
  "queue|isthmus|isthmus-system|--set agent.queue.bytesPerDestination=1073741824 --set agent.queue.bytesPerPod=4294967296 --set agent.queue.userspaceBytes=134217728"
  "tc|isthmus|isthmus-system|--set agent.datapath=tc"
  "tc-unverified|isthmus|isthmus-system|--set agent.datapath=tc --set verification.enabled=false"
  "no-hold|isthmus|isthmus-system|--set operator.hold.enabled=false"
  "minimal|lab|lab|--set operator.leaderElection=false --set uninstall.enabled=false --set fullnameOverride=netlab --set-json imagePullSecrets=[{\"name\":\"regcred\"}]"
)
for v in "${variants[@]}"; do
  IFS='|' read -r name release ns args <<<"$v"
  # shellcheck disable=SC2086
  "$HELM" lint "$CHART" --strict --kube-version "$KUBE_VERSION" --namespace "$ns" $args >"$work/lint-$name.log" 2>&1 ||
    { cat "$work/lint-$name.log"; fail "helm lint ($name)"; }
  # shellcheck disable=SC2086
  "$HELM" template "$release" "$CHART" --kube-version "$KUBE_VERSION" --namespace "$ns" --skip-crds $args >"$work/$name.yaml" ||
    fail "helm template ($name)"
  python3 "$CHART/tests/check_rendered.py" "$work/$name.yaml" "$name" || fail "rendered objects ($name)"
done
step "helm lint --strict and helm template: ${#variants[@]} value sets, rendered objects checked"
# Not indented, to keep the blocks' history: the static checks below do not depend on the API server's version.
if [ -z "$server_only" ]; then
# Verification, scrape objects and the dashboard: off by default; on, every object is there, the flags follow the
# values, the ConfigMap holds the dashboard file verbatim, and every metric the dashboard queries is one the
# agent's or the operator's real registry holds (operator/tests/dashboard.rs, run on the rendered copy).
monitoring_args=(--set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true
  --set grafana.dashboard.enabled=true --set verification.enabled=false --set verification.probesPerSecond=25
  --set verification.pairsPerLink=2 --set verification.window=60s --set verification.measureInterval=15s)
"$HELM" lint "$CHART" --strict --kube-version "$KUBE_VERSION" "${monitoring_args[@]}" >"$work/lint-monitoring.log" 2>&1 ||
  { cat "$work/lint-monitoring.log"; fail "helm lint (monitoring)"; }
"$HELM" template isthmus "$CHART" --kube-version "$KUBE_VERSION" --namespace isthmus-system --skip-crds \
  "${monitoring_args[@]}" >"$work/monitoring.yaml" || fail "helm template (monitoring)"
python3 "$CHART/tests/check_rendered.py" "$work/monitoring.yaml" monitoring || fail "rendered objects (monitoring)"
"$HELM" template isthmus "$CHART" --namespace isthmus-system --kube-version "$KUBE_VERSION" \
  --set metrics.serviceMonitor.enabled=true --set metrics.serviceMonitor.auth=token >"$work/token.yaml" ||
  fail "helm template (metrics by token)"
python3 "$CHART/tests/check_monitoring.py" "$work/default.yaml" "$work/monitoring.yaml" "$CHART/dashboards/isthmus-links.json" \
  "$work/dashboard.json" "$work/token.yaml" || fail "verification, monitoring and dashboard objects"
ISTHMUS_DASHBOARD_JSON="$work/dashboard.json" cargo test -q -p isthmus-operator --test dashboard >"$work/dashboard-test.log" 2>&1 ||
  { tail -20 "$work/dashboard-test.log"; fail "the dashboard queries metrics that no registry holds"; }
step "verification flags, ServiceMonitor/PodMonitor and the Grafana dashboard ConfigMap rendered only when on; every dashboard metric is registered"
# The CA-key check itself: a rendered Secret holding a CA certificate with a key must be refused.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$work/ca.key" -subj /CN=ca -days 1 \
  -addext basicConstraints=critical,CA:TRUE -out "$work/ca.crt" 2>/dev/null
python3 - "$work/default.yaml" "$work/ca.crt" "$work/ca.key" >"$work/with-ca.yaml" <<'PY'
import base64, sys
b = lambda p: base64.b64encode(open(p, "rb").read()).decode()
print(open(sys.argv[1]).read())
print(f"---\napiVersion: v1\nkind: Secret\nmetadata: {{name: leaked-ca}}\ndata: {{tls.crt: {b(sys.argv[2])}, tls.key: {b(sys.argv[3])}}}")
PY
if python3 "$CHART/tests/check_rendered.py" "$work/with-ca.yaml" default 2>"$work/with-ca.err"; then
  fail "check_rendered.py accepted a Secret holding a CA key"
fi
grep -q "leaked-ca: tls.crt is a CA certificate stored with a private key" "$work/with-ca.err" || { cat "$work/with-ca.err"; fail "CA-key refusal"; }
step "no rendered Secret holds a CA key (and a Secret that does is refused)"

# ---- 3. the schema refuses bad values
refused=0
refuse() { # expected-text helm-args...
  local want=$1; shift
  refused=$((refused + 1))
  if "$HELM" template x "$CHART" --kube-version "$KUBE_VERSION" "$@" >"$work/refused.yaml" 2>"$work/refused.err"; then
    fail "values.schema.json accepted: $*"
  fi
  grep -q -- "$want" "$work/refused.err" || { cat "$work/refused.err"; fail "refusal of '$*' does not mention '$want'"; }
}
refuse "/operator/replicas" --set operator.replicas=3
refuse "/operator/replicas" --set operator.replicas=0
refuse "leaderElection" --set operator.replicas=2 --set operator.leaderElection=false
refuse "bogus" --set agent.bogus=1
refuse "logFormat" --set operator.logFormat=xml
refuse "netnsDirs" --set 'agent.netnsDirs={/run/netns\,/x}'
refuse "netnsDirs" --set-json 'agent.netnsDirs=[]'
refuse "apiPort" --set agent.apiPort=70000
refuse "certificateValidityHours" --set tls.certificateValidityHours=0
refuse "tls.renewBeforeDays (40) must be at most half of tls.validityDays (60)" --set tls.validityDays=60 --set tls.renewBeforeDays=40
refuse "tls.certificateValidityHours (800) must be at most tls.renewBeforeDays in hours (720)" --set tls.certificateValidityHours=800
refuse "operator" --set operator.replicas=two
refuse "uninstall.timeoutSeconds (120) must be above operator.cleanupTimeoutSeconds (120)" --set uninstall.timeoutSeconds=120
refuse "bytesPerDestination" --set agent.queue.bytesPerDestination=1000
refuse "bytesPerPod" --set agent.queue.bytesPerPod=6199829
refuse "userspaceBytes" --set agent.queue.userspaceBytes=1000
refuse "destinationsPerPod" --set operator.limits.destinationsPerPod=4096
refuse "destinationsPerLink" --set operator.limits.destinationsPerLink=0
refuse "datapath" --set agent.datapath=ebpf
refuse "operator.limits.destinationsPerPod (100) must be at least operator.limits.destinationsPerLink (512)" \
  --set operator.limits.destinationsPerPod=100
refuse "operator.limits.pairsTotal (1000) must be at least operator.limits.pairsPerLink (512000)" \
  --set operator.limits.pairsTotal=1000
refuse "pairsPerLink" --set operator.limits.pairsPerLink=0
refuse "window" --set verification.window=30
refuse "probesPerSecond" --set verification.probesPerSecond=0
refuse "serviceMonitor" --set metrics.serviceMonitor.enable=true
refuse "gatedPods" --set uninstall.gatedPods=Keep
refuse "auth" --set metrics.serviceMonitor.auth=basic
refuse "metrics.podMonitor scrapes the operator's plain /metrics" --set operator.plainMetrics=false \
  --set metrics.podMonitor.enabled=true
refuse "metrics.serviceMonitor.auth=certificate scrapes the operator's plain /metrics" --set operator.plainMetrics=false \
  --set metrics.serviceMonitor.enabled=true
refuse "metricsSecurePort" --set operator.metricsSecurePort=0
step "values.schema.json and the templates refuse $refused bad values, naming the field"

# ---- 3b. each value is described once, in values.yaml: the schema's descriptions and the README's table are
# copies of it, and the templates read no value values.yaml does not declare.
python3 "$CHART/tests/values_doc.py" --check "$CHART" ||
  fail "values.yaml, values.schema.json and README.md disagree (python3 charts/isthmus/tests/values_doc.py --write)"
# The check itself: a chart whose values.yaml says something else about one value than its schema must fail, naming it.
cp -R "$CHART" "$work/chart-copy"
sed -i 's|^  # -- Port of /metrics, /healthz and /readyz|  # -- Altered: port of /metrics, /healthz and /readyz|' "$work/chart-copy/values.yaml"
! cmp -s "$CHART/values.yaml" "$work/chart-copy/values.yaml" || fail "the self-check found no operator.metricsPort description to alter"
if python3 "$CHART/tests/values_doc.py" --check "$work/chart-copy" 2>"$work/values-doc.err"; then
  fail "values_doc.py --check accepted a values.yaml description that the schema does not carry"
fi
grep -q "values.schema.json: operator.metricsPort: description differs" "$work/values-doc.err" ||
  { cat "$work/values-doc.err"; fail "values_doc.py --check did not name operator.metricsPort"; }
step "every value described once: values.yaml's comments are values.schema.json's descriptions and README.md's table; the templates read only declared values (an altered description is refused, naming its path)"

fi # -z "$server_only"

[ "${CHART_LINT_SKIP_CLUSTER:-}" = 1 ] && { step "cluster checks skipped (CHART_LINT_SKIP_CLUSTER=1)"; exit 0; }

# ---- 4. against a real Kubernetes API server (1.34, or ISTHMUS_K8S_VERSION)
step "starting control-plane-only cluster '$ISTHMUS_CLUSTER_NAME'"
cluster_up=1
e2e/cluster/cluster up --control-plane-only >"$work/up.log" 2>&1 || { tail -20 "$work/up.log"; fail "cluster up"; }
kc() { e2e/cluster/cluster kubectl "$@"; }
export KUBECONFIG
KUBECONFIG=$(e2e/cluster/cluster kubeconfig)
kc apply --server-side -f "$CHART/crds/" >/dev/null
kc wait --for condition=Established crd/networklinks.isthmus.dev --timeout=60s >/dev/null
for v in "${variants[@]}"; do
  IFS='|' read -r name release ns args <<<"$v"
  kc get namespace "$ns" >/dev/null 2>&1 || kc create namespace "$ns" >/dev/null
  kc apply --dry-run=server -f "$work/$name.yaml" >"$work/dry-$name.log" 2>&1 ||
    { cat "$work/dry-$name.log"; fail "kubectl apply --dry-run=server ($name)"; }
  step "kubectl apply --dry-run=server ($name): $(grep -c . "$work/dry-$name.log") objects accepted by the $k8s_minor API server"
done

"$HELM" install isthmus "$CHART" --namespace isthmus-system --skip-crds >"$work/install.out" || fail "helm install"
grep -q 'kubectl apply -f examples/three-regions.yaml' "$work/install.out" || { cat "$work/install.out"; fail "NOTES.txt not rendered"; }
grep -q 'rollout status ds/isthmus-agent' "$work/install.out" || fail "NOTES.txt names the wrong DaemonSet"
"$HELM" upgrade isthmus "$CHART" --namespace isthmus-system --skip-crds --set operator.replicas=2 >/dev/null || fail "helm upgrade"
[ "$(kc -n isthmus-system get deploy isthmus-operator -o jsonpath='{.spec.replicas}')" = 2 ] || fail "upgrade did not apply replicas=2"
# Helm's release records (one Secret per revision) hold the rendered manifests: no private key may be among them.
for rev in 1 2; do
  "$HELM" get manifest isthmus --namespace isthmus-system --revision "$rev" >"$work/release-$rev.yaml" || fail "helm get manifest $rev"
  ! grep -q "PRIVATE KEY\|kind: Secret" "$work/release-$rev.yaml" || fail "Helm release revision $rev holds a Secret or a private key"
done
step "helm install + helm upgrade: no Secret and no private key in Helm's release records"
[ -z "$server_only" ] || { step "the operator and agent checks skipped (CHART_LINT_SERVER_ONLY=1)"; exit 0; }

# ---- 4b. the uninstall hook: the operator binary with the rendered args, as the hook's ServiceAccount
# This tree's binaries, built now (a no-op when fresh): a binary left by an earlier build of other sources would
# test the chart against code that is not the chart's.
build_bin() { # package (its debug binary lands in the target directory)
  (cd "$ROOT" && cargo build -p "$1" --bin "$1") >"$work/build-$1.log" 2>&1 ||
    { tail -20 "$work/build-$1.log"; fail "building $1"; }
}
[ -n "${ISTHMUS_OPERATOR_BIN:-}" ] || build_bin isthmus-operator
op_bin=${ISTHMUS_OPERATOR_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/isthmus-operator}
"$HELM" template isthmus "$CHART" --namespace isthmus-system --show-only templates/uninstall-hook.yaml \
  --set uninstall.timeoutSeconds=10 --set operator.cleanupTimeoutSeconds=5 >"$work/hook.yaml"
python3 "$CHART/tests/hook_parts.py" "$work/hook.yaml" rbac "$work/hook-rbac.yaml"
mapfile -t hook_args < <(python3 "$CHART/tests/hook_parts.py" "$work/hook.yaml" args 2>"$work/hook-sa")
hook_as=system:serviceaccount:isthmus-system:$(cat "$work/hook-sa")
# The binary reads a kubeconfig; this copy impersonates the hook's ServiceAccount (kubeconfig `as:`).
python3 "$CHART/tests/hook_parts.py" "$KUBECONFIG" impersonate "$work/hook-kubeconfig" "$hook_as"
hook() { KUBECONFIG="$work/hook-kubeconfig" "$op_bin" "${hook_args[@]}"; }
kc apply -f "$work/hook-rbac.yaml" >/dev/null
kc create namespace chart-lint-links >/dev/null
# A pod that declares the readiness gate (no scheduler runs: it stays unbound, and goes at once when deleted).
gated_pod() { # name
  for _ in $(seq 1 50); do # until the namespace's default ServiceAccount exists
    kc -n chart-lint-links apply -f - >/dev/null 2>&1 <<POD && return 0
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec: {readinessGates: [{conditionType: isthmus.dev/links-applied}], containers: [{name: c, image: localhost/none:1}]}
POD
    sleep 0.2
  done
  fail "creating pod $1"
}
gated_pod gated
# By default the hook, with its own RBAC, refuses while a pod declares the gate, naming it, and deletes nothing.
kc apply -f - >/dev/null <<LINK
apiVersion: isthmus.dev/v1alpha1
kind: NetworkLink
metadata: {name: link-1, namespace: chart-lint-links}
spec: {from: {podSelector: {}}, to: {podSelector: {}}, impairment: {bandwidth: 1Mbit}}
LINK
if hook >"$work/hook-run.log" 2>&1; then fail "the hook went ahead while a pod declares the readiness gate"; fi
grep -q "1 pod(s) declare the readiness gate isthmus.dev/links-applied: chart-lint-links/gated" "$work/hook-run.log" ||
  { cat "$work/hook-run.log"; fail "the hook's refusal does not name chart-lint-links/gated"; }
[ -z "$(kc -n chart-lint-links get networklink link-1 -o jsonpath='{.metadata.deletionTimestamp}')" ] ||
  fail "the refused hook deleted a link"
# With uninstall.gatedPods=Release, its own RBAC lets it uninstall and then release the pod.
"$HELM" template isthmus "$CHART" --namespace isthmus-system --show-only templates/uninstall-hook.yaml \
  --set uninstall.timeoutSeconds=60 --set operator.cleanupTimeoutSeconds=5 --set uninstall.gatedPods=Release \
  >"$work/hook-release.yaml"
python3 "$CHART/tests/hook_parts.py" "$work/hook-release.yaml" rbac "$work/hook-release-rbac.yaml"
mapfile -t release_args < <(python3 "$CHART/tests/hook_parts.py" "$work/hook-release.yaml" args 2>/dev/null)
kc apply -f "$work/hook-release-rbac.yaml" >/dev/null
KUBECONFIG="$work/hook-kubeconfig" "$op_bin" "${release_args[@]}" >"$work/hook-run.log" 2>&1 ||
  { cat "$work/hook-run.log"; fail "the hook with uninstall.gatedPods=Release failed"; }
gate='{.status.conditions[?(@.type=="isthmus.dev/links-applied")].reason}'
[ "$(kc -n chart-lint-links get pod gated -o jsonpath="$gate")" = Uninstalled ] ||
  { cat "$work/hook-run.log"; fail "the hook with uninstall.gatedPods=Release did not release the gated pod"; }
kc -n chart-lint-links delete pod gated --wait=false >/dev/null
kc apply -f "$work/hook-rbac.yaml" >/dev/null # the default hook's rules again, without pods/status
step "uninstall hook: refuses while a pod declares the readiness gate, naming it; with uninstall.gatedPods=Release uninstalls and releases it"
for n in 1 2; do
  kc apply -f - >/dev/null <<LINK
apiVersion: isthmus.dev/v1alpha1
kind: NetworkLink
metadata: {name: link-$n, namespace: chart-lint-links, finalizers: [isthmus.dev/cleanup]}
spec: {from: {podSelector: {}}, to: {podSelector: {}}, impairment: {bandwidth: 1Mbit}}
LINK
done
# No operator removes the finalizers: the hook must fail after its timeout, having deleted the links, naming them.
if hook >"$work/hook-run.log" 2>&1; then fail "the hook succeeded while finalizers remained"; fi
for n in 1 2; do
  grep -q "chart-lint-links/link-$n (finalizers: isthmus.dev/cleanup)" "$work/hook-run.log" ||
    { cat "$work/hook-run.log"; fail "the hook's timeout error does not name chart-lint-links/link-$n"; }
done
[ -n "$(kc -n chart-lint-links get networklink link-1 -o jsonpath='{.metadata.deletionTimestamp}')" ] || fail "the hook did not delete the links"
# The operator's part, simulated: drop the finalizers while the hook waits; the hook must then succeed. This run
# waits up to 60 s instead of the chart's 10: starting kubectl twice on a loaded machine can take most of 10 s,
# and a hook that never sees the finalizers go fails the same either way.
hook_args_long=("${hook_args[@]}")
for i in "${!hook_args_long[@]}"; do
  [ "${hook_args_long[$i]}" != --timeout-seconds ] || hook_args_long[i+1]=60
done
KUBECONFIG="$work/hook-kubeconfig" "$op_bin" "${hook_args_long[@]}" >"$work/hook-run.log" 2>&1 & hook_pid=$!
sleep 2
for n in 1 2; do kc -n chart-lint-links patch networklink "link-$n" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null; done
wait "$hook_pid" || { cat "$work/hook-run.log"; fail "the hook failed although the finalizers were removed"; }
[ -z "$(kc get networklinks -A -o name)" ] || fail "NetworkLinks left after the hook"
kc delete -f "$work/hook-rbac.yaml" >/dev/null
step "uninstall hook: '$op_bin ${hook_args[*]}' as its ServiceAccount times out naming the links while finalizers remain, succeeds once they are gone"

# ---- 4c. the real operator with exactly the chart's RBAC and environment; as CA and signer with the real agent
[ -n "${ISTHMUS_AGENT_BIN:-}" ] || build_bin isthmus-agent
bin=${ISTHMUS_AGENT_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/isthmus-agent}
"$HELM" template isthmus "$CHART" --namespace isthmus-system --show-only templates/operator-deployment.yaml >"$work/operator-deploy.yaml"
python3 "$CHART/tests/operator_rbac.py" --operator "$op_bin" --agent "$bin" --kubectl "$ROOT/e2e/cluster/cluster kubectl" \
  --rendered "$work/operator-deploy.yaml" --work "$work" --kubeconfig "$KUBECONFIG" ||
  { tail -20 "$work/operator.log"; fail "the operator with the chart's RBAC ($op_bin)"; }
step "the real operator ($op_bin) runs with exactly the chart's RBAC and environment, is the CA and signs only genuine agent requests; $bin serves its signed certificate"
# Without nodes the pre-delete hook's Job could never run; its command was checked in 4b, the Job by the cluster e2e suite.
"$HELM" uninstall isthmus --namespace isthmus-system --no-hooks >/dev/null || fail "helm uninstall"
[ -z "$(kc -n isthmus-system get deploy,ds,sa -l app.kubernetes.io/part-of=isthmus -o name)" ] || fail "objects left after helm uninstall"
step "all checks passed"
