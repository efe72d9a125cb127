#!/usr/bin/env python3
"""The operator as CA and signer, with the real agent binary (called by operator_rbac.py while the real operator
runs with exactly the chart's RBAC against the control-plane-only cluster of lint.sh).

1. The operator created the CA Secret (a CA key that no Helm release record holds), published the bundle
   ConfigMap (its ca.crt = the Secret's certificates) and issued the metrics scraper's Secret; the chart's
   ValidatingAdmissionPolicy (tls.guard) refuses the cluster admin's changes to the first two.
2. CertificateSigningRequests for isthmus.dev/agent-serving, created impersonating their requester (kubeconfig
   `as` and `as-user-extra`, as a pod-bound token would carry them):
   - from the cluster admin: Denied, NotAgentServiceAccount;
   - from the agents' ServiceAccount without a node binding: Denied, NoNodeBinding;
   - bound to a pod that does not exist: Denied, NotAgentPod;
   - from an agent pod on node N naming another node: Denied, WrongNames;
   - from an agent pod on node N naming N: Approved and signed; the certificate chains to the bundle and names
     exactly N's DNS name;
   - from that pod naming N and another Service's name: Denied, WrongNames; naming N and the agents' shared name
     (ISTHMUS_AGENT_SHARED_DNS_NAME, the metrics Service's): signed, valid for the shared name.
   - two from one agent pod, made before the operator started (a signer back from an outage): the older Denied,
     Superseded, the newer signed ([`backlog`]).
   (No kubelet runs here: the agent pods are API objects of the installed DaemonSet, bound to a node name.)
3. The real agent (`--tls-source csr`), impersonating an agent pod on node M with the chart's RBAC: obtains its
   certificate through the operator, reads the CAs it trusts from the bundle ConfigMap through the API, and serves. The operator's identity (a client certificate from the CA, as the operator issues it in
   memory) gets 200 when dialling M's name and a refused handshake when dialling N's; the scraper's Secret reads
   /metrics and gets 403 elsewhere; a client certificate from another CA and none are refused in the handshake.
4. The CA Secret deleted ([`replace_ca`]): a new CA at once, the old one trusted (retired) while agent pod N holds
   a certificate from it, the running agent M served from the new CA within seconds, and the old CA no longer
   trusted anywhere once pod N is gone.
"""
import base64, json, os, shlex, signal, socket, subprocess, sys, time
import yaml

SIGNER = "isthmus.dev/agent-serving"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Interop:
    def __init__(self, kubectl, ns, kubeconfig, work, env):
        self.kubectl, self.ns, self.kubeconfig, self.work, self.env = shlex.split(kubectl), ns, kubeconfig, work, env
        self.agent_sa = f"system:serviceaccount:{ns}:{env['ISTHMUS_AGENT_SERVICE_ACCOUNT']}"
        self.n = 0

    def kc(self, *args, kubeconfig=None, **kw):
        # The cluster's kubectl wrapper passes its own --kubeconfig; a later one wins.
        cmd = self.kubectl + (["--kubeconfig", kubeconfig] if kubeconfig else []) + list(args)
        return subprocess.run(cmd, capture_output=True, text=True, **kw)

    def path(self, name):
        return os.path.join(self.work, name)

    def impersonating(self, user, extra=None):
        """A kubeconfig acting as `user` with `extra` (what a pod-bound token's user info carries)."""
        self.n += 1
        cfg = yaml.safe_load(open(self.kubeconfig))
        for u in cfg["users"]:
            u["user"]["as"] = user
            if extra:
                u["user"]["as-user-extra"] = {k: [v] for k, v in extra.items()}
        path = self.path(f"kubeconfig-{self.n}")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        return path

    def openssl(self, *args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    def agent_pod(self, name, node):
        """An API object as the DaemonSet would make it on `node` (no kubelet runs it); returns its extra."""
        ds = json.loads(self.kc("-n", self.ns, "get", "daemonset", self.env["ISTHMUS_AGENT_DAEMONSET"], "-o", "json", check=True).stdout)
        labels = dict(p.split("=", 1) for p in self.env["ISTHMUS_AGENT_SELECTOR"].split(","))
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": self.ns, "labels": labels,
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds["metadata"]["name"],
                                                 "uid": ds["metadata"]["uid"], "controller": True}]},
               "spec": {"nodeName": node, "automountServiceAccountToken": False,
                        "containers": [{"name": "agent", "image": "localhost/none:1"}]}}
        self.kc("apply", "-f", "-", input=json.dumps(pod), check=True)
        uid = self.kc("-n", self.ns, "get", "pod", name, "-o", "jsonpath={.metadata.uid}", check=True).stdout
        return {"authentication.kubernetes.io/node-name": node, "authentication.kubernetes.io/pod-name": name,
                "authentication.kubernetes.io/pod-uid": uid}

    def request(self, kubeconfig, dns_name, also=None):
        """A CSR for `dns_name` (and then `also`) created through `kubeconfig`; returns (name, key file)."""
        self.n += 1
        name, key, req = f"chart-lint-{self.n}", self.path(f"csr-{self.n}.key"), self.path(f"csr-{self.n}.pem")
        self.openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                     "-subj", f"/CN={dns_name}", "-addext", f"subjectAltName=DNS:{dns_name}" + (f",DNS:{also}" if also else ""), "-out", req)
        csr = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": name},
               "spec": {"request": base64.b64encode(open(req, "rb").read()).decode(), "signerName": SIGNER,
                        "usages": ["digital signature", "server auth"]}}
        r = self.kc("create", "-f", "-", input=json.dumps(csr), kubeconfig=kubeconfig)
        if r.returncode != 0:
            sys.exit(f"tls-interop: creating CSR {name}: {r.stderr}")
        return name, key

    def outcome(self, name, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            status = json.loads(self.kc("get", "csr", name, "-o", "json", check=True).stdout).get("status", {})
            for c in status.get("conditions", []):
                if c["type"] in ("Denied", "Failed"):
                    return c["type"], c.get("reason"), None
            if status.get("certificate"):
                return "Issued", None, base64.b64decode(status["certificate"])
            time.sleep(0.5)
        return "Pending", None, None


def backlog(kubectl, ns, kubeconfig, work, env):
    """Before the operator starts: two requests of one agent pod, as a signer back from an outage finds them (an
    agent process that restarted, or an agent of an earlier version, made the first). Returns the check to run
    once the operator signs: the older is Denied, Superseded; the newer is signed."""
    t = Interop(kubectl, ns, kubeconfig, work, env)
    t.n = 100  # apart from check()'s names
    agent = t.impersonating(t.agent_sa, t.agent_pod("chart-lint-agent-s", "chart-lint-s"))
    older, _ = t.request(agent, "chart-lint-s.node.isthmus")
    time.sleep(1.1)  # creation times are to the second
    newer, _ = t.request(agent, "chart-lint-s.node.isthmus")

    def verify():
        got = {name: t.outcome(name)[:2] for name in (older, newer)}
        print(f"tls-interop: two requests of one agent pod waiting for the signer: the older {got[older]}, the newer {got[newer]}")
        if got != {older: ("Denied", "Superseded"), newer: ("Issued", None)}:
            sys.exit(f"tls-interop: a pod's older waiting request must be Denied Superseded and only its newest signed: {got}")
    return verify


def replace_ca(t, ns, env, say, fail, call, client_cert, old_operator, agent_log):
    """4. The CA Secret deleted, as an administrator replaces a leaked CA: a new CA signs at once; the old one stays
    trusted (retired) while an agent pod still holds a certificate from it; the running agent asks for a new
    certificate at once; the old CA is dropped once the last agent pod on it is gone."""
    def get_json(kind, name):
        r = t.kc("-n", ns, "get", kind, name, "-o", "json")
        return json.loads(r.stdout) if r.returncode == 0 else None

    def until(what, cond, timeout):
        end = time.time() + timeout
        while time.time() < end:
            got = cond()
            if got:
                return got
            time.sleep(0.5)
        fail(f"{what}: not within {timeout} s; see {agent_log}")

    old_ca = open(t.path("ca.crt"), "rb").read().decode()
    # chart-lint-agent-s (the backlog's pod) holds no certificate worth waiting for here.
    t.kc("-n", ns, "delete", "pod", "chart-lint-agent-s", "--wait=false")
    r = t.kc("-n", ns, "delete", "secret", env["ISTHMUS_CA_SECRET"])
    if r.returncode != 0:
        fail(f"deleting the CA Secret: {r.stderr}")
    started = time.time()

    def replaced():
        secret, bundle = get_json("secret", env["ISTHMUS_CA_SECRET"]), get_json("configmap", env["ISTHMUS_CA_BUNDLE"])
        if not (secret and bundle):
            return None
        new_ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
        data = bundle.get("data", {})
        if new_ca == old_ca or data.get("ca.crt") != new_ca + old_ca or data.get("retired.crt") != old_ca:
            return None
        return secret
    secret = until("a new CA Secret, and a bundle trusting the new and the retired CA", replaced, 30)
    for k in ("ca.crt", "ca.key"):
        open(t.path(f"new-{k}"), "wb").write(base64.b64decode(secret["data"][k]))
    if base64.b64decode(secret["data"]["retired.crt"]).decode() != old_ca:
        fail("the new CA Secret does not keep the old CA's certificate as retired")
    say(f"CA Secret deleted: a new CA in {time.time() - started:.1f} s; the bundle trusts it and the old one, retired")

    new_operator = client_cert("operator-new", t.path("new-ca.crt"), t.path("new-ca.key"))
    # Dialled trusting the new CA only: the handshake succeeds once the agent serves a certificate from it.
    until("the agent serves a certificate from the new CA and accepts the operator's from it",
          lambda: call("chart-lint-m", new_operator, cacert=t.path("new-ca.crt")) == "200", 60)
    say(f"the running agent asked for a new certificate at once: served from the new CA {time.time() - started:.1f} s after the deletion")
    bundle = get_json("configmap", env["ISTHMUS_CA_BUNDLE"])["data"]
    if bundle.get("retired.crt") != old_ca:
        fail("the old CA was dropped while chart-lint-agent-n still holds a certificate from it")
    got = call("chart-lint-m", old_operator, cacert=t.path("new-ca.crt"))
    if got != "200":
        fail(f"the operator's identity from the retired CA, while an agent still holds a certificate from it: HTTP {got}")
    say("while chart-lint-agent-n holds a certificate from the old CA, the old CA stays trusted (HTTP 200 with a client certificate from it)")

    t.kc("-n", ns, "delete", "pod", "chart-lint-agent-n", "--wait=false")
    gone = time.time()
    until("the old CA dropped once no agent pod holds a certificate from it",
          lambda: get_json("configmap", env["ISTHMUS_CA_BUNDLE"])["data"] == {"ca.crt": base64.b64decode(secret["data"]["ca.crt"]).decode()}
          and "retired.crt" not in get_json("secret", env["ISTHMUS_CA_SECRET"])["data"], 40)
    until("the agent refuses the retired CA's client certificate", lambda: call("chart-lint-m", old_operator, cacert=t.path("new-ca.crt")) == "000", 10)
    got = call("chart-lint-m", new_operator, cacert=t.path("new-ca.crt"))
    if got != "200":
        fail(f"the operator's identity from the new CA after the hand-over: HTTP {got}")
    say(f"chart-lint-agent-n gone: the old CA dropped {time.time() - gone:.1f} s later; the agent refuses a client certificate from it and accepts the new CA's")


def check(kubectl, ns, kubeconfig, work, env, agent_bin):
    t = Interop(kubectl, ns, kubeconfig, work, env)
    fail = lambda msg: sys.exit(f"tls-interop: {msg}")
    say = lambda msg: print(f"tls-interop: {msg}")

    # 1. The CA, the bundle and the scraper's Secret, all made by the operator.
    def get_json(kind, name):
        r = t.kc("-n", ns, "get", kind, name, "-o", "json")
        return json.loads(r.stdout) if r.returncode == 0 else None
    end = time.time() + 60
    while time.time() < end and not (get_json("configmap", env["ISTHMUS_CA_BUNDLE"]) and get_json("secret", env["ISTHMUS_SCRAPER_SECRET"])):
        time.sleep(0.5)
    ca = get_json("secret", env["ISTHMUS_CA_SECRET"])
    bundle_map = get_json("configmap", env["ISTHMUS_CA_BUNDLE"])
    scraper = get_json("secret", env["ISTHMUS_SCRAPER_SECRET"])
    if not (ca and bundle_map and scraper):
        fail(f"the operator did not create the CA Secret, bundle and scraper Secret: {bool(ca)} {bool(bundle_map)} {bool(scraper)}")
    ca_crt, ca_key = (base64.b64decode(ca["data"][k]) for k in ("ca.crt", "ca.key"))
    bundle = bundle_map["data"]["ca.crt"].encode()
    if bundle != ca_crt:
        fail("the bundle ConfigMap's ca.crt differs from the CA Secret's certificates")
    if any(ref.get("kind") for ref in ca["metadata"].get("ownerReferences", [])) or "helm" in json.dumps(ca["metadata"].get("labels", {})).lower():
        fail("the CA Secret looks Helm-managed")
    for f, data in (("ca.crt", ca_crt), ("ca.key", ca_key), ("bundle.crt", bundle)):
        open(t.path(f), "wb").write(data)
    say("the operator created the CA Secret, published the bundle and issued the scraper's Secret")
    # The chart's guard (tls.guard, installed with the release lint.sh made): the operator, through its
    # ServiceAccount, made both objects; nobody else, the cluster admin included, may change them.
    for kind, name in (("configmap", env["ISTHMUS_CA_BUNDLE"]), ("secret", env["ISTHMUS_CA_SECRET"])):
        r = t.kc("-n", ns, "annotate", kind, name, "chart-lint/tampered=1")
        if r.returncode == 0 or "only the isthmus operator" not in r.stderr:
            fail(f"the cluster admin changed {kind} {name} past the chart's guard: {r.stdout}{r.stderr}")
    say("the chart's ValidatingAdmissionPolicy refuses the cluster admin's changes to the CA Secret and the bundle")

    # 2. Reviews.
    dns = lambda node: f"{node}.node.isthmus"
    cases = []
    cases.append(("from the cluster admin", t.request(kubeconfig, dns("chart-lint-n"))[0], "NotAgentServiceAccount"))
    unbound = t.impersonating(t.agent_sa)
    cases.append(("from the agents' ServiceAccount, no node binding", t.request(unbound, dns("chart-lint-n"))[0], "NoNodeBinding"))
    ghost = t.impersonating(t.agent_sa, {"authentication.kubernetes.io/node-name": "chart-lint-n",
                                         "authentication.kubernetes.io/pod-name": "no-such-pod",
                                         "authentication.kubernetes.io/pod-uid": "0"})
    cases.append(("bound to a pod that does not exist", t.request(ghost, dns("chart-lint-n"))[0], "NotAgentPod"))
    agent_n = t.impersonating(t.agent_sa, t.agent_pod("chart-lint-agent-n", "chart-lint-n"))
    cases.append(("from node chart-lint-n's agent, naming another node", t.request(agent_n, dns("chart-lint-m"))[0], "WrongNames"))
    for what, name, reason in cases:
        got = t.outcome(name)
        say(f"CSR {what}: {got[0]} {got[1]} (want Denied {reason})")
        if got[:2] != ("Denied", reason):
            fail(f"CSR {what}: got {got[:2]}, want Denied {reason}")
    name, node_key = t.request(agent_n, dns("chart-lint-n"))
    kind, _, cert = t.outcome(name)
    if kind != "Issued":
        fail(f"CSR from node chart-lint-n's agent for its own name: {kind}")
    open(t.path("node-n.crt"), "wb").write(cert)
    verify = subprocess.run(["openssl", "verify", "-CAfile", t.path("bundle.crt"), "-purpose", "sslserver", t.path("node-n.crt")],
                            capture_output=True, text=True)
    sans = subprocess.run(["openssl", "x509", "-in", t.path("node-n.crt"), "-noout", "-ext", "subjectAltName,basicConstraints"],
                          capture_output=True, text=True).stdout
    if verify.returncode != 0 or "DNS:chart-lint-n.node.isthmus" not in sans or "," in sans.split("Alternative Name:")[1].split("\n")[1]:
        fail(f"the signed certificate: {verify.stdout}{verify.stderr} {sans}")
    say(f"CSR from node chart-lint-n's agent for its own name: approved and signed, chains to the bundle, SAN only {dns('chart-lint-n')}")
    # The agents' shared name (their metrics Service's), one at a time: a pod's newest request supersedes the others.
    shared = env["ISTHMUS_AGENT_SHARED_DNS_NAME"]
    got = t.outcome(t.request(agent_n, dns("chart-lint-n"), also=f"other.{ns}.svc")[0])
    if got[:2] != ("Denied", "WrongNames"):
        fail(f"CSR from node chart-lint-n's agent for its name and another Service's: got {got[:2]}, want Denied WrongNames")
    kind, _, cert = t.outcome(t.request(agent_n, dns("chart-lint-n"), also=shared)[0])
    if kind != "Issued":
        fail(f"CSR from node chart-lint-n's agent for its name and the shared one: {kind}")
    open(t.path("node-n-shared.crt"), "wb").write(cert)
    verify = subprocess.run(["openssl", "verify", "-CAfile", t.path("bundle.crt"), "-purpose", "sslserver",
                             "-verify_hostname", shared, t.path("node-n-shared.crt")], capture_output=True, text=True)
    if verify.returncode != 0:
        fail(f"the certificate with the shared name: {verify.stdout}{verify.stderr}")
    say(f"CSR from node chart-lint-n's agent for its name and {shared}: signed and valid for {shared}; for another Service's: Denied WrongNames")

    # 3. The real agent, its certificate from the operator.
    ident = env["ISTHMUS_OPERATOR_IDENTITY"]
    def client_cert(tag, ca_crt_path, ca_key_path):
        key, req, crt, ext = (t.path(f"{tag}.{x}") for x in ("key", "csr", "crt", "ext"))
        open(ext, "w").write(f"subjectAltName=DNS:{ident}\nextendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n")
        t.openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                  "-subj", f"/CN={ident}", "-out", req)
        t.openssl("x509", "-req", "-in", req, "-CA", ca_crt_path, "-CAkey", ca_key_path, "-CAcreateserial", "-days", "1",
                  "-extfile", ext, "-out", crt)
        return crt, key
    # The newest CA signs (the first block of the Secret; a fresh install holds one).
    operator = client_cert("operator", t.path("ca.crt"), t.path("ca.key"))
    t.openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", t.path("rogue-ca.key"),
              "-subj", "/CN=rogue", "-days", "1", "-out", t.path("rogue-ca.crt"))
    rogue = client_cert("rogue", t.path("rogue-ca.crt"), t.path("rogue-ca.key"))
    for k in ("tls.crt", "tls.key"):
        open(t.path(f"scraper-{k}"), "wb").write(base64.b64decode(scraper["data"][k]))
    agent_kubeconfig = t.impersonating(t.agent_sa, t.agent_pod("chart-lint-agent-m", "chart-lint-m"))
    api, health = free_port(), free_port()
    os.makedirs(t.path("empty"), exist_ok=True)
    log = open(t.path("agent.log"), "wb")
    agent = subprocess.Popen(
        [agent_bin, "serve", "--listen", f"127.0.0.1:{api}", "--health-listen", f"127.0.0.1:{health}",
         "--tls-source", "csr", "--ca-bundle", env["ISTHMUS_CA_BUNDLE"], "--namespace", ns, "--netns-dirs", t.path("empty"),
         "--cgroup-filter", "/isthmus-chart-lint-no-such-cgroup/", "--operator-identity", ident,
         "--scraper-identity", env["ISTHMUS_SCRAPER_IDENTITY"], "--tls-reload-seconds", "1", "--log-format", "text"],
        env={**os.environ, "NODE_NAME": "chart-lint-m", "KUBECONFIG": agent_kubeconfig}, stdout=log, stderr=log)
    try:
        end = time.time() + 60
        while time.time() < end:
            if subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{health}/readyz"]).returncode == 0:
                break
            if agent.poll() is not None:
                fail(f"agent exited with {agent.returncode}; see {log.name}")
            time.sleep(0.3)
        else:
            fail(f"agent not ready after 60 s (no certificate?); see {log.name}")

        def call(as_node, cert=None, path="/v1/capabilities", cacert=t.path("bundle.crt")):
            host = dns(as_node)
            cmd = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", "--cacert", cacert,
                   "--resolve", f"{host}:{api}:127.0.0.1", f"https://{host}:{api}{path}"]
            if cert:
                cmd += ["--cert", cert[0], "--key", cert[1]]
            r = subprocess.run(cmd, capture_output=True, text=True)
            calls.append(r.stderr)
            return r.stdout.strip() or "000"
        calls = []
        scraper_cert = (t.path("scraper-tls.crt"), t.path("scraper-tls.key"))
        checks = [("operator identity, dialling chart-lint-m", call("chart-lint-m", operator), "200"),
                  ("operator identity, dialling chart-lint-n (the agent's certificate names m)", call("chart-lint-n", operator), "000"),
                  ("scraper Secret, /metrics", call("chart-lint-m", scraper_cert, "/metrics"), "200"),
                  ("scraper Secret, /v1/capabilities", call("chart-lint-m", scraper_cert), "403"),
                  ("operator identity from another CA", call("chart-lint-m", rogue), "000"),
                  ("no client certificate", call("chart-lint-m"), "000")]
        for what, got, want in checks:
            say(f"agent with its CSR-issued certificate: {what}: HTTP {got} (want {want})")
            if got != want:
                fail(f"{what}: got {got}, want {want}; see {log.name}")
        # The refusal when dialling the other node is the name check, not something else.
        if "subject name" not in calls[1]:
            fail(f"dialling chart-lint-n: curl did not refuse the certificate's name: {calls[1]}")
        say(f"dialling chart-lint-n: {calls[1].strip()}")
        replace_ca(t, ns, env, say, fail, call, client_cert, operator, log.name)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
        for pod in ("chart-lint-agent-n", "chart-lint-agent-m"):
            t.kc("-n", ns, "delete", "pod", pod, "--wait=false")
