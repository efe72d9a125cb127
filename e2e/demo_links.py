#!/usr/bin/env python3
"""make demo: wait until every NetworkLink of a namespace is in force, or say why it will not be.

    e2e/demo_links.py wait NAMESPACE TIMEOUT_S KUBECTL...     exit 0 once every link is Ready with all pairs
                                                               applied; 1 on a final condition or at the timeout
    e2e/demo_links.py check MEASURED_TSV LINKS_JSON            one-sided checks of the demo's measurements

A link is in force when `Ready=True` with reason `Applied` for its current generation. Some conditions pass on
their own while a cluster settles — an agent still starting (`AgentUnavailable`, `AgentUnreachable`), a pod the
agent has not seen yet (`PodNotFound`, `InterfaceNotFound`), pairs waiting for the agents (`Pending`), pods not yet
planned (`NoPairs`) — and are waited out. Any other is final (an invalid spec, a kernel without a feature, a
foreign qdisc): waiting would not change it, so the demo stops at once and names it.
"""
import json
import subprocess
import sys
import time

TRANSIENT_READY = {"Pending", "NoPairs"}
TRANSIENT_DEGRADED = {"AgentUnavailable", "AgentUnreachable", "PodNotFound", "InterfaceNotFound"}


def state(link):
    """("done" | "wait" | "final", brief, words) for one NetworkLink as the API returns it: `brief` names the
    conditions' reasons (for progress lines), `words` adds their messages (for a failure)."""
    name = link["metadata"]["name"]
    gen = link["metadata"].get("generation")
    status = link.get("status") or {}
    conds = {c["type"]: c for c in status.get("conditions", []) if c.get("observedGeneration") == gen}
    ready, degraded = conds.get("Ready"), conds.get("Degraded")
    if ready is None:
        return "wait", f"{name}: no status yet", f"{name}: no status for generation {gen} yet"
    brief = f"{name}: Ready={ready['status']} {ready.get('reason')}"
    words = f"{brief} ({ready.get('message', '')})"
    if degraded and degraded.get("status") == "True":
        brief += f", Degraded {degraded.get('reason')}"
        words += f"; Degraded {degraded.get('reason')}: {degraded.get('message', '')}"
    pairs, applied = status.get("pairs"), status.get("pairsApplied")
    if ready["status"] == "True" and ready.get("reason") == "Applied" and pairs == applied:
        verdict = "done"
    elif ready.get("reason") in TRANSIENT_READY:
        verdict = "wait"
    elif ready.get("reason") == "Failed" and degraded and degraded.get("reason") in TRANSIENT_DEGRADED:
        verdict = "wait"
    else:
        verdict = "final"
    return verdict, brief, words


def wait(namespace, timeout_s, kubectl):
    deadline = time.monotonic() + timeout_s
    last_print = 0.0
    while True:
        out = subprocess.run(kubectl + ["-n", namespace, "get", "networklinks", "-o", "json"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"demo: kubectl get networklinks failed: {out.stderr.strip()}", file=sys.stderr)
            return 1
        states = [state(link) for link in json.loads(out.stdout)["items"]]
        if not states:
            print(f"demo: no NetworkLink in namespace {namespace}", file=sys.stderr)
            return 1
        final = [w for s, _, w in states if s == "final"]
        if final:
            print("demo: a link will not be in force without a change (a final condition):", file=sys.stderr)
            for w in final:
                print(f"FAILED: demo: {w}")
            return 1
        pending = [(b, w) for s, b, w in states if s == "wait"]
        if not pending:
            print(f"demo: all {len(states)} links are Ready with every pair applied", file=sys.stderr)
            return 0
        now = time.monotonic()
        if now >= deadline:
            print(f"demo: after {timeout_s} s, {len(pending)} of {len(states)} links are still not in force:",
                  file=sys.stderr)
            for _, w in pending:
                print(f"FAILED: demo: still not in force: {w}")
            return 1
        if now - last_print >= 10:
            brief = "; ".join(b for b, _ in pending)
            print(f"demo: waiting for {len(pending)} of {len(states)} links ({int(deadline - now)} s left): {brief}",
                  file=sys.stderr)
            last_print = now
        time.sleep(1)


def ms(duration):
    """Milliseconds of a NetworkLink duration ("120ms", "1.5s", "500us")."""
    for unit, factor in (("ms", 1.0), ("us", 1e-3), ("µs", 1e-3), ("ns", 1e-6), ("s", 1000.0)):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * factor
    raise ValueError(f"not a duration: {duration}")


def bits(rate):
    """Bits per second of a NetworkLink bandwidth ("100Mbit", "1Gbit", "512kbit")."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bit": 1.0}
    low = rate.lower()
    for unit in ("kbit", "mbit", "gbit", "tbit", "bit"):
        if low.endswith(unit):
            return float(low[: -len(unit)]) * units[unit]
    raise ValueError(f"not a rate: {rate}")


def checks(impairment, both_ways, rtt_p10_ms, goodput_bps):
    """The one-sided checks a busy machine cannot fake, as (what, ok) pairs: no round trip comes faster than the
    configured latency allows (less its jitter, each way it applies), and no transfer beats the rate's payload
    ceiling (1448 of every 1514 bytes) by more than 10 %."""
    out = []
    ways = 2 if both_ways else 1
    if impairment.get("latency"):
        floor = ways * (ms(impairment["latency"]) - ms(impairment.get("jitter", "0ms"))) - 0.5
        out.append((f"RTT p10 {rtt_p10_ms:.2f} ms >= {floor:.2f} ms", rtt_p10_ms >= floor))
    if impairment.get("bandwidth"):
        cap = bits(impairment["bandwidth"]) * 1448 / 1514 * 1.10
        out.append((f"goodput {goodput_bps / 1e6:.1f} <= {cap / 1e6:.1f} Mbit/s", goodput_bps <= cap))
    return out


def check(measured_tsv, links_json):
    links = {l["metadata"]["name"]: l for l in json.load(open(links_json))["items"]}
    bad = []
    for line in open(measured_tsv):
        name, src, dst, rtt, tput = line.rstrip("\n").split("\t")
        rtt, tput, spec = json.loads(rtt), json.loads(tput), links[name]["spec"]
        both = bool(spec.get("symmetric") or spec.get("reverse"))
        p10 = rtt["rtt_ms"]["p10"]
        if p10 is None:
            bad.append(f"{src} -> {dst} ({name}): no echo came back")
            continue
        for what, ok in checks(spec.get("impairment", {}), both, p10, tput["bits_per_second"]):
            if not ok:
                bad.append(f"{src} -> {dst} ({name}): {what} does not hold")
    for b in bad:
        print(f"FAILED: demo: measured outside what a link in force guarantees: {b}")
    return 1 if bad else 0


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "wait":
        sys.exit(wait(sys.argv[2], float(sys.argv[3]), sys.argv[4:]))
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
