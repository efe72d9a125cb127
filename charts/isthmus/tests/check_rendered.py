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

    # RBAC: no wildcards anywhere.
    for kind in ("ClusterRole", "Role"):
        for role in by_kind.get(kind, []):
            for rule in role.get("rules", []):
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    check("*" not in rule.get(field, []), f"{kind} {role['metadata']['name']}: wildcard in {field}")
    # The operator's cluster-wide rules, exactly: what docs and README promise. pods/status is patch only: the
    # readiness gate applies its one condition and never replaces the kubelet's status.
    operator_rules = {
        ("isthmus.dev", "networklinks"): ["get", "list", "watch", "create", "update", "patch", "delete"],
        ("isthmus.dev", "networklinks/status"): ["get", "update", "patch"],
        ("isthmus.dev", "networklinks/finalizers"): ["update"],
        ("isthmus.dev", "networktopologies"): ["get", "list", "watch"],
        ("isthmus.dev", "networktopologies/status"): ["get", "update", "patch"],
        ("isthmus.dev", "networktopologies/finalizers"): ["update"],
        ("", "pods"): ["get", "list", "watch"],
        ("", "namespaces"): ["get", "list", "watch"],
        ("", "services"): ["get", "list", "watch"],
        ("", "pods/status"): ["patch"],
        ("", "nodes"): ["get", "list", "watch"],
        ("", "configmaps"): ["list", "watch"],
        ("events.k8s.io", "events"): ["create", "patch"],
        ("certificates.k8s.io", "certificatesigningrequests"): ["get", "list", "watch"],
        ("certificates.k8s.io", "certificatesigningrequests/approval"): ["update"],
        ("certificates.k8s.io", "certificatesigningrequests/status"): ["update"],
        ("certificates.k8s.io", "signers"): ["approve", "sign"],
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): ["get", "patch"],
        # /metrics by token on operator.metricsSecurePort (as system:auth-delegator).
        ("authentication.k8s.io", "tokenreviews"): ["create"],
        ("authorization.k8s.io", "subjectaccessreviews"): ["create"],
    }
    # The metrics reader, bound to nobody by the chart: exactly get on the non-resource URL /metrics.
    (reader,) = [r for r in by_kind["ClusterRole"] if r["metadata"]["name"].endswith("-metrics-reader")]
    check(reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}], f"metrics-reader rules: {reader['rules']}")
    check(not [b for b in by_kind.get("ClusterRoleBinding", []) if b["roleRef"]["name"] == reader["metadata"]["name"]],
          "the chart binds the metrics-reader ClusterRole")
    holds = by_kind.get("MutatingWebhookConfiguration", [])
    if holds:
        operator_rules[("admissionregistration.k8s.io", "mutatingwebhookconfigurations")] = ["get", "patch"]
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
    signer_rules = [r for r in cluster_role["rules"] if "signers" in r["resources"]]
    check([r.get("resourceNames") for r in signer_rules] == [["isthmus.dev/agent-serving"]],
          "operator ClusterRole: approve/sign only for the signer isthmus.dev/agent-serving")
    # The agent: one ClusterRole, exactly create and get on CertificateSigningRequests (its own certificate) and
    # create on TokenReviews and SubjectAccessReviews (/metrics by token, as system:auth-delegator), and one Role,
    # exactly reading the operator's CA bundle ConfigMap by name (the CAs it trusts).
    agent_bindings = [b for kind in ("ClusterRoleBinding", "RoleBinding") for b in by_kind.get(kind, [])
                      if any(s["name"].endswith("-agent") for s in b["subjects"])]
    check(sorted(b["kind"] for b in agent_bindings) == ["ClusterRoleBinding", "RoleBinding"],
          f"the agent has exactly a ClusterRoleBinding and a RoleBinding: {[b['metadata']['name'] for b in agent_bindings]}")
    for b in agent_bindings:
        kind = b["roleRef"]["kind"]
        (agent_role,) = [r for r in by_kind[kind] if r["metadata"]["name"] == b["roleRef"]["name"]]
        if kind == "ClusterRole":
            check(agent_role["rules"] == [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"],
                                           "verbs": ["create", "get"]},
                                          {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
                                           "verbs": ["create"]},
                                          {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
                                           "verbs": ["create"]}], f"agent ClusterRole rules: {agent_role['rules']}")
        else:
            (operator,) = by_kind["Deployment"]
            op_env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
            bundle_name = op_env["ISTHMUS_CA_BUNDLE"]
            check(agent_role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [bundle_name],
                                           "verbs": ["get", "list", "watch"]}], f"agent Role rules: {agent_role['rules']}")

    (ds,) = by_kind["DaemonSet"]
    (dep,) = by_kind["Deployment"]
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    sc = agent["securityContext"]
    check(pod.get("hostPID") is True and pod.get("hostNetwork") is True, "agent: hostPID and hostNetwork")
    check(pod.get("automountServiceAccountToken") is True, "agent: a pod-bound token (for its certificate request)")
    check(sc.get("privileged") is False, "agent: not privileged")
    check(sc.get("readOnlyRootFilesystem") is True, "agent: read-only root")
    # NET_RAW: the userspace datapath's sockets, and the verification probes' raw sockets.
    caps = ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"] if variant == "tc-unverified" else ["NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"]
    check(sc["capabilities"] == {"drop": ["ALL"], "add": caps}, f"agent: capabilities {caps}")
    check(pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", "agent: seccomp")
    check(ds["spec"]["updateStrategy"]["type"] == "RollingUpdate", "agent: RollingUpdate")
    check(any(t.get("operator") == "Exists" and "key" not in t for t in pod.get("tolerations", []))
          or variant == "tolerations", "agent: tolerates every taint by default")
    for m in agent["volumeMounts"]:
        check(m.get("readOnly") is True, f"agent: mount {m['mountPath']} read-only")
    env = {e["name"]: e for e in agent["env"]}
    check(env["ISTHMUS_DATAPATH"]["value"] == ("tc" if variant.startswith("tc") else "auto"), "agent: ISTHMUS_DATAPATH")
    check(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", "agent: NODE_NAME from the downward API")
    # whole decimal numbers (the agent parses u64), never Helm's float form 1.6777216e+07
    queue = {"default": ("16777216", "67108864"), "queue": ("1073741824", "4294967296")}.get(variant, ("16777216", "67108864"))
    check((env["ISTHMUS_QUEUE_BYTES_PER_DESTINATION"]["value"], env["ISTHMUS_QUEUE_BYTES_PER_POD"]["value"]) == queue,
          f"agent: queue budgets {queue}")
    userspace = {"queue": "134217728"}.get(variant)
    check(env.get("ISTHMUS_USERSPACE_QUEUE_BYTES", {}).get("value") == userspace, f"agent: userspace queue budget {userspace}")
    check(env["ISTHMUS_MEMORY_LIMIT"]["valueFrom"]["resourceFieldRef"] == {"resource": "limits.memory", "divisor": "1"},
          "agent: ISTHMUS_MEMORY_LIMIT from the downward API")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        check(probe in agent, f"agent: {probe}")

    opod = dep["spec"]["template"]["spec"]
    (op,) = opod["containers"]
    # The images are Linux binaries: by default no pod of the chart may land on another OS's node (the one variant
    # that sets a selector sets this one).
    linux = {"kubernetes.io/os": "linux"}
    check(pod.get("nodeSelector") == linux, f"agent: nodeSelector {pod.get('nodeSelector')}, expected {linux}")
    check(opod.get("nodeSelector") == linux, f"operator: nodeSelector {opod.get('nodeSelector')}, expected {linux}")
    for job in by_kind.get("Job", []):
        selector = job["spec"]["template"]["spec"].get("nodeSelector")
        check(selector == linux, f"Job {job['metadata']['name']}: nodeSelector {selector}, expected {linux}")
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
    check((openv["ISTHMUS_MAX_PAIRS_PER_LINK"], openv["ISTHMUS_MAX_PAIRS_TOTAL"]) == ("512000", "2000000"),
          "operator: pair limits as whole numbers (not 1e+06)")

    # Identities: what the operator issues is what the agents require, and the bundle it publishes is the one
    # the agents read.
    sa = opod["serviceAccountName"]
    ns = dep["metadata"]["namespace"]
    check(env["ISTHMUS_OPERATOR_IDENTITY"]["value"] == f"{sa}.{ns}.serviceaccount.isthmus", "identity names the operator's ServiceAccount")
    check(openv["ISTHMUS_OPERATOR_IDENTITY"] == env["ISTHMUS_OPERATOR_IDENTITY"]["value"], "operator issues the identity agents require")
    check(openv["ISTHMUS_SCRAPER_IDENTITY"] == env["ISTHMUS_SCRAPER_IDENTITY"]["value"], "operator issues the scraper identity agents accept")
    check(env["ISTHMUS_TLS_SOURCE"]["value"] == "csr", "agent: serving certificate from the CSR API")
    check(env["ISTHMUS_CA_BUNDLE"]["value"] == openv["ISTHMUS_CA_BUNDLE"], "agent reads the bundle the operator publishes")
    check(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace",
          "agent: the bundle's namespace is its own (downward API)")
    check(not any(v.get("configMap") for v in pod["volumes"]), "agent: no mounted ConfigMap (the bundle is read through the API)")
    check(openv["ISTHMUS_AGENT_SERVICE_ACCOUNT"] == pod["serviceAccountName"], "operator signs for the agents' ServiceAccount")
    (pki,) = [r for r in by_kind["Role"] if r["metadata"]["name"].endswith("-operator-pki")]
    named = sorted({n for r in pki["rules"] for n in r.get("resourceNames", [])})
    check(named == sorted([openv["ISTHMUS_CA_SECRET"], openv["ISTHMUS_SCRAPER_SECRET"], openv["ISTHMUS_CA_BUNDLE"]]),
          f"operator PKI Role names exactly its CA Secret, scraper Secret and bundle: {named}")
    for r in pki["rules"]:
        check(r["verbs"] == ["create"] or r.get("resourceNames"), f"operator PKI Role: {r} not limited to names")
    watched = [r["resourceNames"] for r in pki["rules"] if "watch" in r["verbs"]]
    check(watched == [[openv["ISTHMUS_CA_SECRET"]]], f"operator PKI Role: only the CA Secret is watched: {watched}")

    # The NetworkTopology webhook: the operator serves it on the port the Service targets, under the DNS name the
    # Service has, keeps the caBundle of exactly the rendered configuration (and may patch only that one), which
    # calls the Service; only spec writes of topologies reach it.
    (webhook_config,) = by_kind["ValidatingWebhookConfiguration"]
    (webhook,) = webhook_config["webhooks"]
    service_ref = webhook["clientConfig"]["service"]
    (service,) = [s for s in by_kind["Service"] if s["metadata"]["name"] == service_ref["name"]]
    (service_port,) = service["spec"]["ports"]
    op_ports = {p["name"]: p["containerPort"] for p in op["ports"]}
    check(service_port["port"] == service_ref["port"] and op_ports[service_port["targetPort"]] ==
          int(openv["ISTHMUS_WEBHOOK_ADDR"].rsplit(":", 1)[1]), "webhook: Service port → the operator's listener")
    check(service["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"], "webhook: Service selects the operator pods")
    check(openv["ISTHMUS_WEBHOOK_DNS_NAME"] == f"{service_ref['name']}.{service_ref['namespace']}.svc" and
          service_ref["namespace"] == ns, "webhook: the certificate names the Service the API server calls")
    check(openv["ISTHMUS_WEBHOOK_CONFIGURATION"] == webhook_config["metadata"]["name"],
          "webhook: the operator keeps the rendered configuration's caBundle")
    (webhook_rule,) = [r for r in cluster_role["rules"] if "validatingwebhookconfigurations" in r["resources"]]
    check(webhook_rule.get("resourceNames") == [webhook_config["metadata"]["name"]],
          "operator ClusterRole: get/patch only its own webhook configuration")
    check(service_ref["path"] == "/validate/networktopologies", "webhook: path (isthmus_operator::admission::TOPOLOGIES_PATH)")
    check(webhook["rules"] == [{"apiGroups": ["isthmus.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                                "resources": ["networktopologies"], "scope": "Namespaced"}], "webhook: rules")
    check([c["expression"] for c in webhook["matchConditions"]] == ["request.operation == 'CREATE' || object.spec != oldObject.spec"],
          "webhook: only spec writes are sent (operator/tests/apiserver/topology_webhook.rs registers the same)")
    check(webhook["sideEffects"] == "None" and "caBundle" not in webhook["clientConfig"], "webhook: no side effects, caBundle left to the operator")

    # The hold (operator.hold.enabled): only labelled pods outside the release's namespace reach it, through the same
    # Service; the operator serves it with its own image and keeps the caBundle of exactly that configuration.
    hold_env = sorted(k for k in openv if k.startswith("ISTHMUS_HOLD_"))
    if not holds:
        check(not hold_env, f"hold off: the operator is given no hold flag: {hold_env}")
    else:
        (hold_config,) = holds
        (hold,) = hold_config["webhooks"]
        check(hold["name"] == "hold.isthmus.dev", "hold: webhook name")
        check(hold["clientConfig"]["service"] == {**service_ref, "path": "/mutate/pods"},
              "hold: the NetworkTopology webhook's Service, path isthmus_operator::admission::HOLD_PATH")
        check(hold["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                                 "scope": "Namespaced"}], "hold: pods, CREATE only")
        check(hold["objectSelector"] == {"matchLabels": {"isthmus.dev/wait-for-links": "true"}},
              "hold: only opted-in pods are sent (operator/tests/apiserver/hold_webhook.rs registers the same)")
        check(hold["namespaceSelector"] == {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                                  "values": [ns]}]},
              "hold: never the release's own namespace (the operator's pods must not wait on the operator)")
        check(hold["failurePolicy"] == "Fail" and hold["reinvocationPolicy"] == "IfNeeded" and hold["sideEffects"] == "None"
              and "caBundle" not in hold["clientConfig"], "hold: Fail, reinvoked, no side effects, caBundle left to the operator")
        check(hold_env == ["ISTHMUS_HOLD_IMAGE", "ISTHMUS_HOLD_IMAGE_PULL_POLICY", "ISTHMUS_HOLD_MAX_TIMEOUT_SECONDS",
                           "ISTHMUS_HOLD_TIMEOUT_SECONDS", "ISTHMUS_HOLD_WEBHOOK_CONFIGURATION"], f"hold: the operator's flags {hold_env}")
        check(openv["ISTHMUS_HOLD_IMAGE"] == op["image"] and openv["ISTHMUS_HOLD_IMAGE_PULL_POLICY"] == op["imagePullPolicy"],
              "hold: the init container runs the operator's own image, pulled as the operator's")
        check(openv["ISTHMUS_HOLD_WEBHOOK_CONFIGURATION"] == hold_config["metadata"]["name"],
              "hold: the operator keeps the rendered configuration's caBundle")
        (hold_rule,) = [r for r in cluster_role["rules"] if "mutatingwebhookconfigurations" in r["resources"]]
        check(hold_rule.get("resourceNames") == [hold_config["metadata"]["name"]],
              "operator ClusterRole: get/patch only its own hold configuration")
        check(1 <= int(openv["ISTHMUS_HOLD_TIMEOUT_SECONDS"]) <= int(openv["ISTHMUS_HOLD_MAX_TIMEOUT_SECONDS"]) <= 3600,
              "hold: 1 <= timeoutSeconds <= maxTimeoutSeconds <= 3600 (the operator refuses to start otherwise)")

    # No rendered Secret holds a CA's private key (it would sit in every Helm release revision).
    for secret in by_kind.get("Secret", []):
        name = secret["metadata"]["name"]
        values = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        values.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
        has_key = any(b"PRIVATE KEY" in v for v in values.values())
        check(not any(k.startswith("ca") and k.endswith(".key") for k in values), f"Secret {name}: a CA key entry")
        for k, v in values.items():
            if has_key and b"BEGIN CERTIFICATE" in v:
                with tempfile.NamedTemporaryFile() as f:
                    f.write(v); f.flush()
                    text = subprocess.run(["openssl", "x509", "-in", f.name, "-noout", "-text"], capture_output=True, text=True).stdout
                check("CA:TRUE" not in text, f"Secret {name}: {k} is a CA certificate stored with a private key")

    if errors:
        for e in errors:
            print(f"check_rendered ({variant}): {e}", file=sys.stderr)
        sys.exit(1)

if __name__ == "__main__":
    main()
