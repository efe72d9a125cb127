#!/usr/bin/env python3
"""The real operator binary with the chart's configuration and nothing but the chart's RBAC.

Runs the operator on this machine against the control-plane-only cluster, impersonating the operator's
ServiceAccount (KUBE_RS_DEBUG_IMPERSONATE_USER, honoured by kube's Config::infer), with the environment of the
rendered Deployment (only the listen address is changed to a local one). Then checks that it
- creates the CA Secret, the CA bundle and the scraper's Secret, approves and signs (or denies) agents'
  certificate requests, and the real agent serves the certificate it signed (tls_interop.py);
- becomes ready (every watch listed: pods, namespaces, services, nodes, agents, NetworkLinks);
- takes the Lease named in the chart;
- writes its CA bundle into the NetworkTopology webhook's configuration;
- adds its finalizer to a new NetworkLink and writes its status (observedGeneration);
- applies the readiness gate condition on a pod that declares it (pods/status);
- lets a deleted NetworkLink go (no agents: nothing to confirm);
- never logs a 403 / forbidden.
Usage: operator_rbac.py --operator BIN --agent BIN --kubectl "CMD" --rendered DEPLOY.yaml --work DIR --kubeconfig FILE
"""
import argparse, base64, json, os, shlex, signal, socket, subprocess, sys, time
import yaml

import tls_interop

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def main():
    p = argparse.ArgumentParser()
    for a in ("--operator", "--agent", "--kubectl", "--rendered", "--work", "--kubeconfig"):
        p.add_argument(a, required=True)
    args = p.parse_args()
    kubectl = shlex.split(args.kubectl)
    kc = lambda *a, **kw: subprocess.run(kubectl + list(a), capture_output=True, text=True, **kw)

    docs = [d for d in yaml.safe_load_all(open(args.rendered)) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    ns = dep["metadata"]["namespace"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    rendered_env = dict(env)
    port = free_port()
    env.update({
        "ISTHMUS_METRICS_ADDR": f"127.0.0.1:{port}",
        "ISTHMUS_WEBHOOK_ADDR": f"127.0.0.1:{free_port()}",
        "POD_NAME": "chart-lint-operator", "POD_NAMESPACE": ns, "ISTHMUS_LOG_FORMAT": "text",
        "KUBECONFIG": args.kubeconfig,
        "KUBE_RS_DEBUG_IMPERSONATE_USER": f"system:serviceaccount:{ns}:{pod['serviceAccountName']}",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    })
    # The DaemonSet the agent pods belong to: <fullname>-agent, as the Lease is <fullname>-operator.
    rendered_env["ISTHMUS_AGENT_DAEMONSET"] = env["ISTHMUS_LEASE_NAME"].removesuffix("-operator") + "-agent"
    verify_backlog = tls_interop.backlog(args.kubectl, ns, args.kubeconfig, args.work, rendered_env)
    log_path = os.path.join(args.work, "operator.log")
    log = open(log_path, "wb")
    op = subprocess.Popen([args.operator], env=env, stdout=log, stderr=log)
    failures = []
    try:
        def wait(what, cond, timeout=40):
            end = time.time() + timeout
            while time.time() < end:
                if op.poll() is not None:
                    sys.exit(f"operator-rbac: the operator exited ({op.returncode}) while waiting for {what}; see {log_path}")
                if cond():
                    print(f"operator-rbac: {what}")
                    return True
                time.sleep(0.5)
            failures.append(what)
            print(f"operator-rbac: FAILED: {what}")
            return False

        ready = lambda: subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}/readyz"]).returncode == 0
        wait("ready: every watch listed with the chart's RBAC", ready)
        lease = env["ISTHMUS_LEASE_NAME"]
        wait(f"holds Lease {ns}/{lease}", lambda: kc("-n", ns, "get", "lease", lease, "-o",
             "jsonpath={.spec.holderIdentity}").stdout == "chart-lint-operator")
        # The NetworkTopology webhook's configuration (installed by `helm install` before this runs): the leader
        # writes the CA bundle it publishes into caBundle.
        webhook = env["ISTHMUS_WEBHOOK_CONFIGURATION"]
        def bundle_written():
            ca_bundle = kc("get", "validatingwebhookconfiguration", webhook, "-o",
                           "jsonpath={.webhooks[0].clientConfig.caBundle}").stdout
            published = kc("-n", ns, "get", "configmap", env["ISTHMUS_CA_BUNDLE"], "-o", "jsonpath={.data.ca\\.crt}").stdout
            return bool(ca_bundle) and base64.b64decode(ca_bundle).decode() == published
        wait(f"wrote the CA bundle into ValidatingWebhookConfiguration {webhook} (patch)", bundle_written)
        kc("create", "namespace", "chart-lint-rbac")
        link = {"apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkLink",
                "metadata": {"name": "rbac-check", "namespace": "chart-lint-rbac"},
                "spec": {"from": {"podSelector": {"matchLabels": {"app": "a"}}},
                         "to": {"podSelector": {"matchLabels": {"app": "b"}}},
                         "impairment": {"bandwidth": "10Mbit"}}}
        kc("apply", "-f", "-", input=json.dumps(link), check=True)
        get = lambda path: kc("-n", "chart-lint-rbac", "get", "networklink", "rbac-check", "-o", f"jsonpath={path}").stdout
        wait("added its finalizer to a new NetworkLink (patch)", lambda: "isthmus.dev/cleanup" in get("{.metadata.finalizers}"))
        wait("wrote the link's status (status subresource)", lambda: get("{.status.observedGeneration}") == "1")
        # A pod that declares the readiness gate and that no link selects: the operator marks it True (NoLinks).
        # No kubelet runs here; the pod only has to exist. Created once the namespace's default ServiceAccount does.
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "gated", "namespace": "chart-lint-rbac", "labels": {"app": "c"}},
               "spec": {"readinessGates": [{"conditionType": "isthmus.dev/links-applied"}],
                        "containers": [{"name": "c", "image": "localhost/none:1"}]}}
        wait("created a gated pod", lambda: kc("apply", "-f", "-", input=json.dumps(pod)).returncode == 0)
        gate = '{.status.conditions[?(@.type=="isthmus.dev/links-applied")].reason}'
        wait("applied the readiness gate condition on the gated pod (pods/status patch)",
             lambda: kc("-n", "chart-lint-rbac", "get", "pod", "gated", "-o", f"jsonpath={gate}").stdout == "NoLinks")
        kc("-n", "chart-lint-rbac", "delete", "networklink", "rbac-check", "--wait=false", check=True)
        wait("released the deleted link (finalizer removed)",
             lambda: "NotFound" in kc("-n", "chart-lint-rbac", "get", "networklink", "rbac-check").stderr)
        tls_interop.check(args.kubectl, ns, args.kubeconfig, args.work, rendered_env, args.agent)
        verify_backlog()
    finally:
        op.send_signal(signal.SIGTERM)
        try:
            op.wait(15)
        except subprocess.TimeoutExpired:
            op.kill()
        log.close()
    text = open(log_path, errors="replace").read()
    if "impersonating user" not in text:
        failures.append("the operator did not impersonate its ServiceAccount (no 'impersonating user' log line)")
    forbidden = [l for l in text.splitlines() if "forbidden" in l.lower() or " 403" in l]
    for l in forbidden[:5]:
        print(f"operator-rbac: forbidden: {l[:300]}")
    if forbidden or failures:
        sys.exit(f"operator-rbac: {len(failures)} check(s) failed, {len(forbidden)} forbidden log line(s); see the log above / {log_path}")
    print(f"operator-rbac: no forbidden request in {len(text.splitlines())} log lines")

if __name__ == "__main__":
    main()
