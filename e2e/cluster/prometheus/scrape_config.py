#!/usr/bin/env python3
"""The scrape configuration the Prometheus Operator would generate from the chart's rendered ServiceMonitors, for a
Prometheus running outside the cluster (make prometheus-check, ../prometheus-check), and the checks of its targets.

  scrape_config.py refs RENDERED.yaml
      one line per object a tlsConfig names: KIND NAMESPACE NAME KEY FILE (KIND configmap or secret; FILE the
      name under CERTDIR the caller writes that key's value to)
  scrape_config.py config RENDERED.yaml KUBECONFIG TOKENFILE CERTDIR OUT.yml OUT-jobs.json
      the Prometheus configuration (JSON, which is YAML): per ServiceMonitor endpoint one job, as the Operator
      names and relabels it; bearerTokenFile becomes authorization.credentials_file TOKENFILE (Prometheus' token
      in the cluster is that file outside it); OUT-jobs.json says per job how to reach its targets by hand
  scrape_config.py targets TARGETS.json JOBS.json EXPECTED
      exit 0 when /api/v1/targets lists EXPECTED active targets, every one up; else names what is wrong
  scrape_config.py token-targets TARGETS.json JOBS.json
      one line per active target of a job that sends bearerTokenFile: SCRAPE-URL SERVER-NAME CA-FILE
Only what the chart renders is translated; any other ServiceMonitor field stops the script, naming it, so that a
chart change the check cannot follow fails loudly instead of being scraped some other way.
"""
import json
import re
import sys

import yaml

ENDPOINT_FIELDS = {"path", "interval", "port", "scheme", "bearerTokenFile", "tlsConfig", "scrapeTimeout", "honorLabels"}
TLS_FIELDS = {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify"}


def fail(msg):
    sys.exit(f"scrape_config: {msg}")


def monitors(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    found = [d for d in docs if d.get("kind") == "ServiceMonitor"]
    if not found:
        fail(f"no ServiceMonitor in {path}")
    return found


def label_name(name):
    # Prometheus' Kubernetes discovery writes a label's name with every character outside [a-zA-Z0-9_] as _.
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def file_name(kind, ns, ref):
    # The Operator's own layout: /etc/prometheus/certs/<kind>_<namespace>_<name>_<key>.
    return f"{kind}_{ns}_{ref['name']}_{ref['key']}"


def tls_refs(ns, tls):
    """(option, kind, ref) for each object the tlsConfig names."""
    unknown = set(tls) - TLS_FIELDS
    if unknown:
        fail(f"tlsConfig fields this check does not translate: {sorted(unknown)}")
    out = []
    for option, field in (("ca_file", "ca"), ("cert_file", "cert")):
        src = tls.get(field)
        if src is None:
            continue
        if set(src) - {"configMap", "secret"} or len(src) != 1:
            fail(f"tlsConfig.{field}: expected one of configMap or secret, got {src}")
        kind = "configmap" if "configMap" in src else "secret"
        out.append((option, kind, src.get("configMap") or src.get("secret")))
    if "keySecret" in tls:
        out.append(("key_file", "secret", tls["keySecret"]))
    return out


def cmd_refs(rendered):
    seen = set()
    for sm in monitors(rendered):
        ns = sm["metadata"]["namespace"]
        for ep in sm["spec"]["endpoints"]:
            for _, kind, ref in tls_refs(ns, ep.get("tlsConfig", {})):
                line = f"{kind} {ns} {ref['name']} {ref['key']} {file_name(kind, ns, ref)}"
                if line not in seen:
                    seen.add(line)
                    print(line)


def job(sm, i, ep, kubeconfig, token_file, cert_dir):
    unknown = set(ep) - ENDPOINT_FIELDS
    if unknown:
        fail(f"ServiceMonitor {sm['metadata']['name']}: endpoint fields this check does not translate: {sorted(unknown)}")
    if "port" not in ep:
        fail(f"ServiceMonitor {sm['metadata']['name']}: an endpoint without a named port")
    ns = sm["metadata"]["namespace"]
    spec = sm["spec"]
    selector = spec.get("selector", {})
    if set(selector) - {"matchLabels"} or not selector.get("matchLabels"):
        fail(f"ServiceMonitor {sm['metadata']['name']}: only selector.matchLabels is translated, got {selector}")
    names = spec.get("namespaceSelector", {}).get("matchNames") or [ns]
    relabel = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    # The Operator keeps the endpoints of Services carrying every matchLabels label (value and presence)...
    for key, value in sorted(selector["matchLabels"].items()):
        n = label_name(key)
        relabel.append({"action": "keep", "regex": f"({value});true",
                        "source_labels": [f"__meta_kubernetes_service_label_{n}",
                                          f"__meta_kubernetes_service_labelpresent_{n}"]})
    # ... and of those, the addresses of the endpoint's port.
    relabel.append({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": ep["port"]})
    relabel += [
        {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind",
                           "__meta_kubernetes_endpoint_address_target_name"],
         "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
        {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind",
                           "__meta_kubernetes_endpoint_address_target_name"],
         "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    name = f"serviceMonitor/{ns}/{sm['metadata']['name']}/{i}"
    out = {
        "job_name": name,
        "honor_labels": bool(ep.get("honorLabels", False)),
        "kubernetes_sd_configs": [{"role": "endpoints", "kubeconfig_file": kubeconfig, "namespaces": {"names": names}}],
        "metrics_path": ep.get("path", "/metrics"),
        "scheme": ep.get("scheme", "http"),
        "relabel_configs": relabel,
    }
    for key, field in (("scrape_interval", "interval"), ("scrape_timeout", "scrapeTimeout")):
        if field in ep:
            out[key] = ep[field]
    how = {"scheme": out["scheme"], "token": False}
    tls = ep.get("tlsConfig")
    if tls is not None:
        conf = {}
        for option, kind, ref in tls_refs(ns, tls):
            conf[option] = f"{cert_dir}/{file_name(kind, ns, ref)}"
        if "serverName" in tls:
            conf["server_name"] = tls["serverName"]
        conf["insecure_skip_verify"] = bool(tls.get("insecureSkipVerify", False))
        out["tls_config"] = conf
        how.update(server_name=conf.get("server_name"), ca_file=conf.get("ca_file"))
    if "bearerTokenFile" in ep:
        # In the cluster the file is Prometheus' own ServiceAccount token; here, a token of the same kind.
        out["authorization"] = {"type": "Bearer", "credentials_file": token_file}
        how["token"] = True
    return out, how


def cmd_config(rendered, kubeconfig, token_file, cert_dir, out_path, jobs_path):
    jobs, hows = [], {}
    for sm in monitors(rendered):
        for i, ep in enumerate(sm["spec"]["endpoints"]):
            j, how = job(sm, i, ep, kubeconfig, token_file, cert_dir)
            jobs.append(j)
            hows[j["job_name"]] = how
    config = {"global": {"scrape_interval": "30s", "evaluation_interval": "30s"}, "scrape_configs": jobs}
    with open(out_path, "w") as f:
        json.dump(config, f, indent=1)
    with open(jobs_path, "w") as f:
        json.dump(hows, f, indent=1)
    for j in jobs:
        h = hows[j["job_name"]]
        print(f"{j['job_name']}: {h['scheme']}{' with the token' if h['token'] else ''}"
              f"{', server name ' + h['server_name'] if h.get('server_name') else ''}")


def active(targets_path, jobs_path):
    with open(targets_path) as f:
        targets = json.load(f)["data"]["activeTargets"]
    with open(jobs_path) as f:
        jobs = json.load(f)
    return [t for t in targets if t["scrapePool"] in jobs], jobs


def cmd_targets(targets_path, jobs_path, expected):
    targets, _ = active(targets_path, jobs_path)
    down = [t for t in targets if t["health"] != "up"]
    for t in down:
        print(f"  {t['health']}: {t['scrapePool']} {t['scrapeUrl']} (pod {t['labels'].get('pod')}): "
              f"{t.get('lastError') or 'not scraped yet'}", file=sys.stderr)
    if len(targets) != int(expected):
        print(f"  {len(targets)} active targets, expected {expected}: "
              f"{sorted(t['scrapeUrl'] for t in targets)}", file=sys.stderr)
    if down or len(targets) != int(expected):
        sys.exit(1)
    for t in sorted(targets, key=lambda t: t["scrapeUrl"]):
        print(f"  up: {t['scrapePool']} {t['scrapeUrl']} (pod {t['labels'].get('pod')})")


def cmd_token_targets(targets_path, jobs_path):
    targets, jobs = active(targets_path, jobs_path)
    for t in targets:
        how = jobs[t["scrapePool"]]
        if how["token"]:
            print(t["scrapeUrl"], how.get("server_name") or "-", how.get("ca_file") or "-")


def main(argv):
    commands = {"refs": (cmd_refs, 1), "config": (cmd_config, 6), "targets": (cmd_targets, 3),
                "token-targets": (cmd_token_targets, 2)}
    if len(argv) < 2 or argv[1] not in commands or len(argv) - 2 != commands[argv[1]][1]:
        sys.exit(__doc__)
    fn, _ = commands[argv[1]]
    fn(*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
