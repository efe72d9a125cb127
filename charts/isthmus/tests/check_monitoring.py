#!/usr/bin/env python3
"""Checks of the verification flags, the Prometheus Operator objects and the Grafana dashboard ConfigMap.

Usage: check_monitoring.py DEFAULT.yaml MONITORING.yaml DASHBOARD.json OUT.json TOKEN.yaml
DEFAULT.yaml is rendered with the chart's defaults; MONITORING.yaml with metrics.serviceMonitor, metrics.podMonitor
and grafana.dashboard on, verification off, probesPerSecond 25, pairsPerLink 2, window 60s, measureInterval 15s.
The dashboard as the ConfigMap holds it is written to OUT.json (for the metric-name test). TOKEN.yaml is rendered
with metrics.serviceMonitor.enabled and metrics.serviceMonitor.auth=token.
"""
import json, sys
import yaml

def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]

def container(docs, kind, name_suffix):
    (obj,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    return obj["spec"]["template"]["spec"]["containers"][0]

def main():
    default, monitoring = load(sys.argv[1]), load(sys.argv[2])
    dashboard_file, out, token = sys.argv[3], sys.argv[4], load(sys.argv[5])
    errors = []
    def check(cond, msg):
        if not cond:
            errors.append(msg)

    kinds = lambda docs: sorted(d["kind"] for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor"))
    check(kinds(default) == [], f"default values render scrape objects: {kinds(default)}")
    check(not [d for d in default if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")],
          "default values render the dashboard ConfigMap")
    check(kinds(monitoring) == ["PodMonitor", "PodMonitor", "ServiceMonitor", "ServiceMonitor"],
          f"monitoring values: {kinds(monitoring)}")

    want = {
        "default": (default, ["serve", "--verify=true", "--probe-rate=10", "--probe-pairs-per-link=4", "--probe-window=30s"],
                    ["--verify=true", "--measure-interval=10s"]),
        "monitoring": (monitoring, ["serve", "--verify=false", "--probe-rate=25", "--probe-pairs-per-link=2",
                                    "--probe-window=60s"], ["--verify=false", "--measure-interval=15s"]),
    }
    for name, (docs, agent_args, operator_args) in want.items():
        got = container(docs, "DaemonSet", "-agent").get("args")
        check(got == agent_args, f"{name}: agent args {got}, expected {agent_args}")
        got = container(docs, "Deployment", "-operator").get("args")
        check(got == operator_args, f"{name}: operator args {got}, expected {operator_args}")

    for d in monitoring:
        if d["kind"] not in ("ServiceMonitor", "PodMonitor"):
            continue
        check(d["apiVersion"] == "monitoring.coreos.com/v1", f"{d['kind']} {d['metadata']['name']}: apiVersion")
        endpoints = d["spec"].get("endpoints") or d["spec"].get("podMetricsEndpoints")
        (ep,) = endpoints
        if d["metadata"]["name"].endswith("-agent"):
            tls = ep.get("tlsConfig", {})
            check(ep.get("port") == "api" and ep.get("scheme") == "https", f"{d['metadata']['name']}: agent endpoint {ep}")
            check(tls.get("keySecret", {}).get("name", "").endswith("-metrics-scraper-tls"),
                  f"{d['metadata']['name']}: the scraper's client certificate")
            check(tls.get("serverName") == "isthmus-agent-metrics.isthmus-system.svc" and not tls.get("insecureSkipVerify")
                  and tls.get("ca", {}).get("configMap", {}).get("name") == "isthmus-ca-bundle",
                  f"{d['metadata']['name']}: the agents verified under their shared name: {tls}")
        else:
            check(ep.get("port") == "metrics" and "tlsConfig" not in ep, f"{d['metadata']['name']}: operator endpoint {ep}")
    # auth: token: the agents' ServiceMonitor scrapes the metrics port with Prometheus' own token; the
    # DaemonSet serves that port.
    (agent_sm,) = [d for d in token if d["kind"] == "ServiceMonitor" and d["metadata"]["name"].endswith("-agent")]
    (ep,) = agent_sm["spec"]["endpoints"]
    check(ep.get("port") == "metrics" and ep.get("scheme") == "https"
          and ep.get("bearerTokenFile") == "/var/run/secrets/kubernetes.io/serviceaccount/token"
          and ep.get("tlsConfig", {}).get("ca", {}).get("configMap", {}).get("name", "").endswith("-ca-bundle")
          and "keySecret" not in ep.get("tlsConfig", {}) and not ep["tlsConfig"].get("insecureSkipVerify"),
          f"token: agent endpoint {ep}")
    # auth: token: the operator's likewise, on its HTTPS port, verified under the name its listener's certificate
    # is issued for.
    (op_sm,) = [d for d in token if d["kind"] == "ServiceMonitor" and d["metadata"]["name"].endswith("-operator")]
    (op_ep,) = op_sm["spec"]["endpoints"]
    check(op_ep.get("port") == "metrics-https" and op_ep.get("scheme") == "https"
          and op_ep.get("bearerTokenFile") == ep.get("bearerTokenFile")
          and op_ep.get("tlsConfig", {}).get("ca") == ep["tlsConfig"].get("ca")
          and not op_ep["tlsConfig"].get("insecureSkipVerify"), f"token: operator endpoint {op_ep}")
    operator = container(token, "Deployment", "-operator")
    op_ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    op_env0 = {e["name"]: e.get("value") for e in operator["env"]}
    check(op_ep["tlsConfig"].get("serverName") == op_env0.get("ISTHMUS_METRICS_DNS_NAME")
          == "isthmus-operator-metrics.isthmus-system.svc", f"token: operator name {op_ep} {op_env0}")
    check(op_env0.get("ISTHMUS_METRICS_SECURE_ADDR") == f"0.0.0.0:{op_ports.get('metrics-https')}",
          f"token: operator metrics-https port {op_ports} {op_env0}")
    (op_svc,) = [d for d in token if d["kind"] == "Service" and d["metadata"]["name"].endswith("-operator-metrics")]
    check({"name": "metrics-https", "port": op_ports.get("metrics-https"), "targetPort": "metrics-https"}
          in op_svc["spec"]["ports"], f"token: operator Service ports {op_svc['spec']['ports']}")
    # The name the scrape verifies is the one the agents ask for, the operator signs, and the Service has.
    shared = ep["tlsConfig"].get("serverName")
    op_env = {e["name"]: e.get("value") for e in container(token, "Deployment", "-operator")["env"]}
    agent_env = {e["name"]: e.get("value") for e in container(token, "DaemonSet", "-agent")["env"]}
    check(shared == agent_env.get("ISTHMUS_SHARED_DNS_NAME") == op_env.get("ISTHMUS_AGENT_SHARED_DNS_NAME")
          == "isthmus-agent-metrics.isthmus-system.svc", f"token: shared name {shared} {agent_env} {op_env}")
    agent = container(token, "DaemonSet", "-agent")
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    env = {e["name"]: e.get("value") for e in agent["env"]}
    check(env.get("ISTHMUS_METRICS_LISTEN") == f"0.0.0.0:{ports.get('metrics')}", f"token: agent metrics port {ports} {env}")
    (svc,) = [d for d in token if d["kind"] == "Service" and d["metadata"]["name"].endswith("-agent-metrics")]
    check({"name": "metrics", "port": ports.get("metrics"), "targetPort": "metrics"} in svc["spec"]["ports"],
          f"token: agent Service ports {svc['spec']['ports']}")
    # The scrape Services; the webhook's Service is rendered whatever the monitoring values.
    services = [d for d in monitoring if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics")]
    check(len(services) == 2 and all(s["spec"]["clusterIP"] == "None" for s in services), "two headless Services")

    (cm,) = [d for d in monitoring if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    check(cm["metadata"]["labels"].get("grafana_dashboard") == "1", "the dashboard ConfigMap's grafana_dashboard label")
    (text,) = cm["data"].values()
    check(json.loads(text) == json.load(open(dashboard_file)), "the ConfigMap's dashboard differs from the file")
    open(out, "w").write(text)

    for e in errors:
        print(f"check_monitoring: {e}", file=sys.stderr)
    sys.exit(1 if errors else 0)

main()
