#!/usr/bin/env python3
"""The chart's certificates against the real agent binary (called by lint.sh with a cluster holding a release).

1. The Secrets' files in place: the operator's client certificate gets 200 from /v1/capabilities (and curl,
   playing the operator, verifies the agent's serving certificate for the configured server name); the agent's own
   certificate is refused with 403 (right CA, wrong identity); no certificate fails the handshake; the metrics
   scraper's certificate reads /metrics and gets 403 from /v1/capabilities; the health port serves no /metrics.
2. CA rotation the documented way (delete the CA Secret, helm upgrade): the new files are written over the old
   ones while the agent runs; within a few reload periods the new operator certificate is accepted and the old
   one refused, by the same agent process.
The agent runs on 127.0.0.1 with free ports, sees no process (cgroup filter) and no pinned namespace (an empty
directory); only GET /v1/capabilities is called, which changes nothing.
"""
import argparse, base64, json, os, shlex, signal, socket, subprocess, sys, time

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def main():
    p = argparse.ArgumentParser()
    for a in ("--agent", "--kubectl", "--namespace", "--helm", "--chart", "--work"):
        p.add_argument(a, required=True)
    args = p.parse_args()
    kubectl = shlex.split(args.kubectl)
    work = args.work
    server_name = "isthmus-agent"

    def secret_files(name, into):
        os.makedirs(into, exist_ok=True)
        data = json.loads(subprocess.check_output(kubectl + ["-n", args.namespace, "get", "secret", name, "-o", "json"]))["data"]
        for key in ("ca.crt", "tls.crt", "tls.key"):
            tmp = os.path.join(into, key + ".tmp")
            with open(tmp, "wb") as f:
                f.write(base64.b64decode(data[key]))
            os.replace(tmp, os.path.join(into, key))

    agent_dir, op_dir, scraper_dir, empty = (
        os.path.join(work, d) for d in ("agent-tls", "operator-tls", "scraper-tls", "empty-netns"))
    os.makedirs(empty, exist_ok=True)
    secret_files("isthmus-agent-tls", agent_dir)
    secret_files("isthmus-operator-tls", op_dir)
    secret_files("isthmus-metrics-scraper-tls", scraper_dir)
    identity = f"isthmus-operator.{args.namespace}.serviceaccount.isthmus"
    scraper = f"isthmus-metrics-scraper.{args.namespace}.isthmus"
    api, health = free_port(), free_port()
    log = open(os.path.join(work, "agent.log"), "wb")
    agent = subprocess.Popen(
        [args.agent, "serve", "--listen", f"127.0.0.1:{api}", "--health-listen", f"127.0.0.1:{health}",
         "--tls-dir", agent_dir, "--netns-dirs", empty, "--cgroup-filter", "/isthmus-chart-lint-no-such-cgroup/",
         "--operator-identity", identity, "--scraper-identity", scraper, "--tls-reload-seconds", "1",
         "--log-format", "text"],
        env={**os.environ, "NODE_NAME": "chart-lint"}, stdout=log, stderr=log)
    try:
        def call(client_dir, with_cert=True, path="/v1/capabilities"):
            cmd = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5",
                   "--cacert", os.path.join(op_dir, "ca.crt"),
                   "--resolve", f"{server_name}:{api}:127.0.0.1", f"https://{server_name}:{api}{path}"]
            if with_cert:
                cmd += ["--cert", os.path.join(client_dir, "tls.crt"), "--key", os.path.join(client_dir, "tls.key")]
            r = subprocess.run(cmd, capture_output=True, text=True)
            return r.stdout.strip() or "000"

        deadline = time.time() + 30
        while time.time() < deadline:
            if subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{health}/readyz"]).returncode == 0:
                break
            if agent.poll() is not None:
                sys.exit(f"agent exited with {agent.returncode}; see {log.name}")
            time.sleep(0.3)
        else:
            sys.exit("agent not ready after 30 s")

        checks = [("operator certificate", call(op_dir), "200"),
                  ("agent certificate as client", call(agent_dir), "403"),
                  ("no client certificate", call(op_dir, with_cert=False), "000"),
                  ("scraper certificate, /metrics", call(scraper_dir, path="/metrics"), "200"),
                  ("scraper certificate, /v1/capabilities", call(scraper_dir), "403"),
                  ("agent certificate, /metrics", call(agent_dir, path="/metrics"), "403")]
        plain = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5",
                                f"http://127.0.0.1:{health}/metrics"], capture_output=True, text=True)
        checks.append(("health port, /metrics", plain.stdout.strip() or "000", "404"))
        for what, got, want in checks:
            print(f"tls-interop: {what}: HTTP {got} (want {want})")
            if got != want:
                sys.exit(f"tls-interop: {what}: got {got}, want {want}")

        # Rotation: a new CA and new leaves, written over the files of the running agent.
        old_op = os.path.join(work, "operator-tls-old")
        os.makedirs(old_op, exist_ok=True)
        for key in ("ca.crt", "tls.crt", "tls.key"):
            with open(os.path.join(op_dir, key), "rb") as src, open(os.path.join(old_op, key), "wb") as dst:
                dst.write(src.read())
        subprocess.check_call(kubectl + ["-n", args.namespace, "delete", "secret", "isthmus-ca"], stdout=subprocess.DEVNULL)
        subprocess.check_call([args.helm, "upgrade", "isthmus", args.chart, "--namespace", args.namespace, "--skip-crds",
                               "--reuse-values"], stdout=subprocess.DEVNULL)
        secret_files("isthmus-agent-tls", agent_dir)
        secret_files("isthmus-operator-tls", op_dir)
        started = time.time()
        # The agent polls its files every second; the bound is for a loaded machine and costs nothing when it
        # switches at once.
        while time.time() - started < 60:
            new, old = call(op_dir), call(old_op)
            if new == "200" and old == "000":
                break
            time.sleep(0.5)
        print(f"tls-interop: after CA rotation: new operator certificate HTTP {new}, old one {old} "
              f"(after {time.time() - started:.1f} s, same agent process: {agent.poll() is None})")
        if (new, old) != ("200", "000") or agent.poll() is not None:
            sys.exit("tls-interop: the agent did not switch to the rotated certificates")
        log.flush()
        if b"TLS certificates changed on disk" not in open(log.name, "rb").read():
            sys.exit("tls-interop: the agent did not log the reload")
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()

if __name__ == "__main__":
    main()
