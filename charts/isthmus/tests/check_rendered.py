#!/usr/bin/env python3
"""Static checks of `helm template` output: what the chart promises about privileges and identities.

Usage: check_rendered.py RENDERED.yaml VARIANT
"""
import base64, subprocess, sys, tempfile
import yaml

def main():
    path, variant = sys.argv[1], sys.argv[2]
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    errors = []
    def check(cond, msg):
        if not cond:
            errors.append(msg)

    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)

    # RBAC: no wildcards anywhere; the agent has no binding at all.
    for kind in ("ClusterRole", "Role"):
        for role in by_kind.get(kind, []):
            for rule in role.get("rules", []):
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    check("*" not in rule.get(field, []), f"{kind} {role['metadata']['name']}: wildcard in {field}")
    # The operator's cluster-wide rules, exactly: what docs and README promise. pods/status is patch only: the
    # readiness gate applies its one condition and never replaces the kubelet's status.
    operator_rules = {
        ("isthmus.dev", "networklinks"): ["get", "list", "watch", "update", "patch"],
        ("isthmus.dev", "networklinks/status"): ["get", "update", "patch"],
        ("isthmus.dev", "networklinks/finalizers"): ["update"],
        ("", "pods"): ["get", "list", "watch"],
        ("", "namespaces"): ["get", "list", "watch"],
        ("", "services"): ["get", "list", "watch"],
        ("", "pods/status"): ["patch"],
        ("", "nodes"): ["get", "list", "watch"],
        ("events.k8s.io", "events"): ["create", "patch"],
    }
    (cluster_role,) = [r for r in by_kind["ClusterRole"] if r["metadata"]["name"].endswith("-operator")]
    rendered = {}
    for rule in cluster_role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                check((group, resource) not in rendered, f"operator ClusterRole: {group}/{resource} in two rules")
                rendered[(group, resource)] = sorted(rule["verbs"])
    expected = {k: sorted(v) for k, v in operator_rules.items()}
    for key in sorted(set(rendered) | set(expected)):
        check(rendered.get(key) == expected.get(key),
              f"operator ClusterRole: {key[0] or 'core'}/{key[1]} verbs {rendered.get(key)}, expected {expected.get(key)}")
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for b in by_kind.get(kind, []):
            for s in b["subjects"]:
                check(not s["name"].endswith("-agent"), f"{kind} {b['metadata']['name']} binds the agent")

    (ds,) = by_kind["DaemonSet"]
    (dep,) = by_kind["Deployment"]
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    sc = agent["securityContext"]
    check(pod.get("hostPID") is True and pod.get("hostNetwork") is True, "agent: hostPID and hostNetwork")
    check(pod.get("automountServiceAccountToken") is False, "agent: no API token")
    check(sc.get("privileged") is False, "agent: not privileged")
    check(sc.get("readOnlyRootFilesystem") is True, "agent: read-only root")
    caps = ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"] if variant == "tc" else ["NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"]
    check(sc["capabilities"] == {"drop": ["ALL"], "add": caps}, f"agent: capabilities {caps}")
    check(pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", "agent: seccomp")
    check(ds["spec"]["updateStrategy"]["type"] == "RollingUpdate", "agent: RollingUpdate")
    check(any(t.get("operator") == "Exists" and "key" not in t for t in pod.get("tolerations", []))
          or variant == "tolerations", "agent: tolerates every taint by default")
    for m in agent["volumeMounts"]:
        check(m.get("readOnly") is True, f"agent: mount {m['mountPath']} read-only")
    env = {e["name"]: e for e in agent["env"]}
    check(env["ISTHMUS_DATAPATH"]["value"] == ("tc" if variant == "tc" else "auto"), "agent: ISTHMUS_DATAPATH")
    check(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", "agent: NODE_NAME from the downward API")
    # whole decimal numbers (the agent parses u64), never Helm's float form 1.6777216e+07
    queue = {"default": ("16777216", "67108864"), "queue": ("1073741824", "4294967296")}.get(variant, ("16777216", "67108864"))
    check((env["ISTHMUS_QUEUE_BYTES_PER_DESTINATION"]["value"], env["ISTHMUS_QUEUE_BYTES_PER_POD"]["value"]) == queue,
          f"agent: queue budgets {queue}")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        check(probe in agent, f"agent: {probe}")

    opod = dep["spec"]["template"]["spec"]
    (op,) = opod["containers"]
    osc, psc = op["securityContext"], opod["securityContext"]
    check(psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532, "operator: non-root 65532")
    check(osc["readOnlyRootFilesystem"] is True and osc["allowPrivilegeEscalation"] is False, "operator: read-only, no escalation")
    check(osc["capabilities"] == {"drop": ["ALL"]}, "operator: drops every capability")
    check(psc["seccompProfile"]["type"] == "RuntimeDefault", "operator: seccomp")
    check(1 <= dep["spec"]["replicas"] <= 2, "operator: 1 or 2 replicas")
    check(op["livenessProbe"]["httpGet"]["path"] == "/healthz" and op["readinessProbe"]["httpGet"]["path"] == "/readyz", "operator: probes")
    openv = {e["name"]: e.get("value") for e in op["env"]}
    check(openv["ISTHMUS_AGENT_PORT"] == str(agent["ports"][0]["containerPort"]), "operator dials the agents' API port")
    selector = ",".join(f"{k}={v}" for k, v in sorted(ds["spec"]["selector"]["matchLabels"].items()))
    check(",".join(sorted(openv["ISTHMUS_AGENT_SELECTOR"].split(","))) == selector, "operator's agent selector = the DaemonSet's")
    check((openv["ISTHMUS_MAX_DESTINATIONS_PER_LINK"], openv["ISTHMUS_MAX_DESTINATIONS_PER_POD"]) == ("512", "1024"),
          "operator: plan limits as whole numbers")

    # Certificates: the agent's SAN is what the operator verifies, the operator's SAN what the agent requires.
    secrets = {s["metadata"]["name"]: s for s in by_kind["Secret"]}
    def san_of(secret):
        pem = base64.b64decode(secret["data"]["tls.crt"])
        with tempfile.NamedTemporaryFile() as f:
            f.write(pem); f.flush()
            out = subprocess.check_output(["openssl", "x509", "-in", f.name, "-noout", "-ext", "subjectAltName"], text=True)
        return [x.strip()[4:] for x in out.splitlines()[1].split(",") if x.strip().startswith("DNS:")]
    agent_secret = next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == "tls")
    op_secret = next(v["secret"]["secretName"] for v in opod["volumes"] if v["name"] == "agent-client")
    check(san_of(secrets[agent_secret]) == [openv["ISTHMUS_AGENT_SERVER_NAME"]], "agent certificate SAN = operator's server name")
    check(san_of(secrets[op_secret]) == [env["ISTHMUS_OPERATOR_IDENTITY"]["value"]], "operator certificate SAN = agent's operator identity")
    sa = opod["serviceAccountName"]
    ns = dep["metadata"]["namespace"]
    check(env["ISTHMUS_OPERATOR_IDENTITY"]["value"] == f"{sa}.{ns}.serviceaccount.isthmus", "identity names the operator's ServiceAccount")
    check(secrets[agent_secret]["data"]["ca.crt"] == secrets[op_secret]["data"]["ca.crt"], "one CA for both sides")

    if errors:
        for e in errors:
            print(f"check_rendered ({variant}): {e}", file=sys.stderr)
        sys.exit(1)

if __name__ == "__main__":
    main()
