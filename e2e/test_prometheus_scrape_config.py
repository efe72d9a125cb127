#!/usr/bin/env python3
"""e2e/cluster/prometheus/scrape_config.py (run by `make unit`): the scrape configuration make prometheus-check
derives from the chart's ServiceMonitors, as the Prometheus Operator would, and its checks of /api/v1/targets."""
import contextlib
import importlib.util
import io
import json
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("scrape_config", os.path.join(HERE, "cluster", "prometheus", "scrape_config.py"))
sc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sc)

RENDERED = """
apiVersion: v1
kind: Service
metadata: {name: isthmus-agent-metrics, namespace: isthmus-system}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: isthmus-operator, namespace: isthmus-system}
spec:
  namespaceSelector: {matchNames: [isthmus-system]}
  selector: {matchLabels: {app.kubernetes.io/name: isthmus-operator, app.kubernetes.io/instance: isthmus}}
  endpoints:
    - {path: /metrics, interval: 30s, port: metrics}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: isthmus-agent, namespace: isthmus-system}
spec:
  namespaceSelector: {matchNames: [isthmus-system]}
  selector: {matchLabels: {app.kubernetes.io/name: isthmus-agent}}
  endpoints:
    - path: /metrics
      interval: 30s
      port: metrics
      scheme: https
      bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
      tlsConfig:
        ca: {configMap: {name: isthmus-ca-bundle, key: ca.crt}}
        serverName: isthmus-agent-metrics.isthmus-system.svc
    - path: /metrics
      port: api
      scheme: https
      tlsConfig:
        ca: {configMap: {name: isthmus-ca-bundle, key: ca.crt}}
        cert: {secret: {name: scraper, key: tls.crt}}
        keySecret: {name: scraper, key: tls.key}
        serverName: isthmus-agent-metrics.isthmus-system.svc
"""


class ScrapeConfig(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.path = lambda name: os.path.join(self.dir.name, name)

    def write(self, name, text):
        with open(self.path(name), "w") as f:
            f.write(text)
        return self.path(name)

    def run_cmd(self, *argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            sc.main(["scrape_config.py", *argv])
        return out.getvalue()

    def config(self, rendered=RENDERED):
        self.run_cmd("config", self.write("r.yaml", rendered), "/kc", "/token", "/certs", self.path("p.yml"),
                     self.path("jobs.json"))
        with open(self.path("p.yml")) as f, open(self.path("jobs.json")) as g:
            return {j["job_name"]: j for j in json.load(f)["scrape_configs"]}, json.load(g)

    def test_refs_name_each_object_once_in_the_operators_file_layout(self):
        out = self.run_cmd("refs", self.write("r.yaml", RENDERED)).splitlines()
        self.assertEqual(out, [
            "configmap isthmus-system isthmus-ca-bundle ca.crt configmap_isthmus-system_isthmus-ca-bundle_ca.crt",
            "secret isthmus-system scraper tls.crt secret_isthmus-system_scraper_tls.crt",
            "secret isthmus-system scraper tls.key secret_isthmus-system_scraper_tls.key"])

    def test_jobs_as_the_operator_generates_them(self):
        jobs, how = self.config()
        self.assertEqual(sorted(jobs), ["serviceMonitor/isthmus-system/isthmus-agent/0",
                                        "serviceMonitor/isthmus-system/isthmus-agent/1",
                                        "serviceMonitor/isthmus-system/isthmus-operator/0"])
        op = jobs["serviceMonitor/isthmus-system/isthmus-operator/0"]
        self.assertEqual(op["scheme"], "http")
        self.assertNotIn("tls_config", op)
        self.assertNotIn("authorization", op)
        self.assertEqual(op["kubernetes_sd_configs"],
                         [{"role": "endpoints", "kubeconfig_file": "/kc", "namespaces": {"names": ["isthmus-system"]}}])
        keeps = [r for r in op["relabel_configs"] if r.get("action") == "keep"]
        self.assertEqual(keeps[0], {"action": "keep", "regex": "(isthmus);true", "source_labels": [
            "__meta_kubernetes_service_label_app_kubernetes_io_instance",
            "__meta_kubernetes_service_labelpresent_app_kubernetes_io_instance"]})
        self.assertEqual(keeps[2], {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                                    "regex": "metrics"})
        agent = jobs["serviceMonitor/isthmus-system/isthmus-agent/0"]
        self.assertEqual(agent["authorization"], {"type": "Bearer", "credentials_file": "/token"})
        self.assertEqual(agent["tls_config"], {
            "ca_file": "/certs/configmap_isthmus-system_isthmus-ca-bundle_ca.crt",
            "server_name": "isthmus-agent-metrics.isthmus-system.svc", "insecure_skip_verify": False})
        self.assertEqual(agent["scrape_interval"], "30s")
        cert = jobs["serviceMonitor/isthmus-system/isthmus-agent/1"]
        self.assertNotIn("authorization", cert)
        self.assertEqual(cert["tls_config"]["key_file"], "/certs/secret_isthmus-system_scraper_tls.key")
        self.assertEqual([h["token"] for h in how.values()], [False, True, False])

    def test_a_field_it_does_not_translate_stops_it(self):
        with self.assertRaises(SystemExit) as e:
            self.config(RENDERED.replace("port: api", "port: api\n      basicAuth: {}"))
        self.assertIn("basicAuth", str(e.exception.code))

    def targets(self, *states):
        _, how = self.config()
        items = [{"scrapePool": pool, "scrapeUrl": f"https://198.18.0.{i}:9465/metrics", "health": health,
                  "lastError": "" if health == "up" else "server returned HTTP status 403 Forbidden",
                  "labels": {"pod": f"p{i}"}} for i, (pool, health) in enumerate(states)]
        return self.write("t.json", json.dumps({"data": {"activeTargets": items}}))

    def test_targets_all_up_and_counted(self):
        agent, op = "serviceMonitor/isthmus-system/isthmus-agent/0", "serviceMonitor/isthmus-system/isthmus-operator/0"
        path = self.targets((agent, "up"), (agent, "up"), (op, "up"))
        self.assertIn("up: ", self.run_cmd("targets", path, self.path("jobs.json"), "3"))
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            self.run_cmd("targets", path, self.path("jobs.json"), "4")
        down = self.targets((agent, "up"), (agent, "down"), (op, "up"))
        err = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
            self.run_cmd("targets", down, self.path("jobs.json"), "3")
        self.assertIn("403 Forbidden", err.getvalue())
        self.assertEqual(self.run_cmd("token-targets", path, self.path("jobs.json")).splitlines(), [
            f"https://198.18.0.{i}:9465/metrics isthmus-agent-metrics.isthmus-system.svc "
            "/certs/configmap_isthmus-system_isthmus-ca-bundle_ca.crt" for i in (0, 1)])


if __name__ == "__main__":
    unittest.main()
