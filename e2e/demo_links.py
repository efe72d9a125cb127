#!/usr/bin/env python3
"""make demo: wait until every NetworkLink of a namespace is in force, or say why it will not be.

    e2e/demo_links.py wait NAMESPACE TIMEOUT_S KUBECTL...     exit 0 once every link is Ready with all pairs
                                                               applied; 1 on a final condition or at the timeout
    e2e/demo_links.py namespace EXAMPLE.yaml                   the example's Namespace (the first one it creates)
    e2e/demo_links.py pairs LINKS_JSON PODS_JSON                one line per linked pair and direction to measure
    e2e/demo_links.py report MEASURED_TSV LINKS_JSON            the table of configured vs measured figures
    e2e/demo_links.py check MEASURED_TSV LINKS_JSON            one-sided checks of the demo's measurements

A link is in force when `Ready=True` with reason `Applied` for its current generation. Some conditions pass on
their own while a cluster settles — an agent still starting (`AgentUnavailable`, `AgentUnreachable`), a pod the
agent has not seen yet (`PodNotFound`, `InterfaceNotFound`), pairs waiting for the agents (`Pending`), pods not yet
planned (`NoPairs`) — and are waited out. Any other is final (an invalid spec, a kernel without a feature, a
foreign qdisc): waiting would not change it, so the demo stops at once and names it.
"""
import json
import re
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
    """Milliseconds of a NetworkLink duration ("120ms", "1.5s", "500us"; "0")."""
    if duration == "0":
        return 0.0
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


# What a rate counts per TCP segment: a full frame (1500 bytes of IP + 14 of Ethernet) carries 1448 of payload
# (IP, TCP with timestamps). netem's queue counts such frames.
FRAME = 1514
PAYLOAD = 1448


def checks(impairment, both_ways, rtt_p10_ms, goodput_bps):
    """The one-sided checks a busy machine cannot fake, as (what, ok) pairs: no round trip comes faster than the
    configured latency allows (less its jitter, each way it applies), and no transfer beats the rate's payload
    ceiling (1448 of every 1514 bytes) by more than 10 %."""
    way = direction_of(impairment)
    return direction_checks(way, way if both_ways else NO_IMPAIRMENT, rtt_p10_ms, goodput_bps)


NO_IMPAIRMENT = {"latency_ms": 0.0, "jitter_ms": 0.0, "loss": 0.0, "rate_bps": None, "queue_limit": None}


def direction_of(impairment):
    """One direction's figures from an Impairment of the spec (`loss` None where it is Gilbert-Elliott)."""
    loss = impairment.get("loss") or {}
    return {
        "latency_ms": ms(impairment["latency"]) if impairment.get("latency") else 0.0,
        "jitter_ms": ms(impairment["jitter"]) if impairment.get("jitter") else 0.0,
        "loss": (float(loss["percent"].rstrip("%")) / 100 if "percent" in loss else None) if loss else 0.0,
        "rate_bps": bits(impairment["bandwidth"]) if impairment.get("bandwidth") else None,
        "queue_limit": impairment.get("queueLimit"),
    }


def _status_way(latency, loss, bandwidth):
    lat, _, jit = latency.partition("±")
    return {
        "latency_ms": ms(lat),
        "jitter_ms": ms(jit) if jit else 0.0,
        "loss": None if loss == "GE" else float(loss.rstrip("%")) / 100,
        "rate_bps": None if bandwidth == "-" else bits(bandwidth),
        "queue_limit": None,
    }


def installed_queue_limit(link):
    """The packets the node's queue bound left of an explicit queueLimit, when it cut one (`Ready`'s message names
    the cut: "... (to 11081 packets from 60000 asked, ...)"); None when nothing was cut."""
    status = link.get("status") or {}
    if not status.get("queueLimitsCapped"):
        return None
    for c in status.get("conditions", []):
        if c.get("type") == "Ready":
            m = re.search(r"to (\d+) packets from (\d+) asked", c.get("message", ""))
            if m:
                return int(m.group(1))
    return None


def directions(link):
    """[forward, reverse] (reverse absent on a one-way link): each direction's figures in force. The status's
    summaries come first, as the operator resolved them (a profile's uplink and downlink, overrides, `symmetric`);
    the spec is read only for what they do not carry (queueLimit), and for everything before a status exists."""
    spec, status = link["spec"], link.get("status") or {}
    fwd_spec = spec.get("impairment") or {}
    rev_spec = fwd_spec if spec.get("symmetric") else (spec.get("reverse") or {})
    has_reverse = bool(spec.get("symmetric") or spec.get("reverse") or (spec.get("profile") and not spec.get("oneWay")))
    if all(status.get(k) for k in ("latency", "loss", "bandwidth")):
        parts = [status[k].split("/") for k in ("latency", "loss", "bandwidth")]
        ways = [_status_way(*(p[i] for p in parts)) for i in range(len(parts[0]))]
    else:
        ways = [direction_of(fwd_spec)] + ([direction_of(rev_spec)] if has_reverse else [])
    capped = installed_queue_limit(link)
    for way, imp in zip(ways, (fwd_spec, rev_spec)):
        asked = imp.get("queueLimit")
        way["queue_limit"] = min(asked, capped) if asked and capped else asked
    return ways


def expected(ways, direction):
    """What a measurement from the sending side of `direction` (0 forward, 1 reverse) should show: its probes go out
    through that direction and come back through the other (unimpaired by this link when it is one-way)."""
    out = ways[direction]
    back = ways[1 - direction] if len(ways) > 1 else NO_IMPAIRMENT
    rtt = out["latency_ms"] + back["latency_ms"]
    spread = out["jitter_ms"] + back["jitter_ms"]
    loss = None if out["loss"] is None or back["loss"] is None else 1 - (1 - out["loss"]) * (1 - back["loss"])
    loaded = None
    if out["queue_limit"] and out["rate_bps"]:
        # netem sits below the direction's TBF, so its queue holds both the packets in their delay and those
        # waiting for the rate: a full queue of L frames drains at the rate, and a packet leaves after whichever
        # is longer, L frames at the rate or its own delay (Little's law).
        drain_ms = out["queue_limit"] * FRAME * 8 / out["rate_bps"] * 1000
        loaded = max(drain_ms, out["latency_ms"] + out["jitter_ms"]) + back["latency_ms"]
    return {"out": out, "back": back, "rtt_ms": rtt, "spread_ms": spread, "loss": loss,
            "rate_bps": out["rate_bps"], "queue_limit": out["queue_limit"], "loaded_rtt_ms": loaded}


def direction_checks(out, back, rtt_p10_ms, goodput_bps, loaded_p10_ms=None):
    """The one-sided checks of one direction, as (what, ok) pairs: no round trip (idle, or under the direction's
    own bulk transfer) comes faster than both directions' latencies less their jitters allow, and no transfer
    beats this direction's payload ceiling (1448 of every 1514 bytes) by more than 10 %."""
    res = []
    if out["latency_ms"] or back["latency_ms"]:
        floor = (out["latency_ms"] - out["jitter_ms"]) + (back["latency_ms"] - back["jitter_ms"]) - 0.5
        res.append((f"RTT p10 {rtt_p10_ms:.2f} ms >= {floor:.2f} ms", rtt_p10_ms >= floor))
        if loaded_p10_ms is not None:
            res.append((f"RTT p10 under bulk {loaded_p10_ms:.2f} ms >= {floor:.2f} ms", loaded_p10_ms >= floor))
    if out["rate_bps"] and goodput_bps is not None:
        cap = out["rate_bps"] * PAYLOAD / FRAME * 1.10
        res.append((f"goodput {goodput_bps / 1e6:.1f} <= {cap / 1e6:.1f} Mbit/s", goodput_bps <= cap))
    return res


def _pods_of(pods, sel):
    m = (sel or {}).get("matchLabels", {})
    return [p for p in pods if all(p["metadata"].get("labels", {}).get(k) == v for k, v in m.items())]


def _side_name(sel, pod):
    """The side as the example names it: its selector's label values (`frankfurt`, `phone,lte`), else the pod."""
    values = list(((sel or {}).get("matchLabels") or {}).values())
    return ",".join(values) if values else pod["metadata"]["name"]


def pairs(links_doc, pods_doc):
    """One entry per link and direction it impairs, between the first running pod of each side:
    (link, direction 0|1, source pod, from-name, to-name, destination IP, whether to load it with a bulk
    transfer while measuring the round trip: only a direction with an explicit queueLimit and a rate)."""
    pods = [p for p in pods_doc["items"]
            if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp")]
    out = []
    for link in links_doc["items"]:
        spec = link["spec"]
        if "podSelector" not in spec["to"] or spec["to"].get("namespaceSelector") is not None:
            continue  # CIDRs or pods elsewhere: nothing in the example's namespace to measure towards
        a, b = _pods_of(pods, spec["from"]["podSelector"]), _pods_of(pods, spec["to"]["podSelector"])
        if not a or not b:
            continue
        ways = directions(link)
        ends = [(a[0], spec["from"]["podSelector"], b[0], spec["to"]["podSelector"]),
                (b[0], spec["to"]["podSelector"], a[0], spec["from"]["podSelector"])]
        for d in range(len(ways)):
            src, ssel, dst, dsel = ends[d]
            loaded = bool(ways[d]["queue_limit"] and ways[d]["rate_bps"])
            out.append((link["metadata"]["name"], d, src["metadata"]["name"], _side_name(ssel, src),
                        _side_name(dsel, dst), dst["status"]["podIP"], loaded))
    return out


def namespace_of(example_text):
    """The Namespace an example creates (its first), or the namespace its first namespaced object names."""
    m = re.search(r"^kind:\s*Namespace\s*$.*?^\s+name:\s*([a-z0-9-]+)", example_text, re.M | re.S)
    if m is None:
        m = re.search(r"^\s+namespace:\s*([a-z0-9-]+)", example_text, re.M)
    return m.group(1) if m else None


def _measured(measured_tsv):
    """The demo's measurements: link, direction, from, to, rtt JSON, throughput JSON, rtt-under-bulk JSON or -."""
    with open(measured_tsv) as f:
        lines = f.read().splitlines()
    for line in lines:
        name, d, src, dst, rtt, tput, loaded = line.split("\t")
        yield name, int(d), src, dst, json.loads(rtt), json.loads(tput), None if loaded == "-" else json.loads(loaded)


def _links(links_json):
    with open(links_json) as f:
        return {l["metadata"]["name"]: l for l in json.load(f)["items"]}


def check(measured_tsv, links_json):
    links = _links(links_json)
    bad = []
    for name, d, src, dst, rtt, tput, loaded in _measured(measured_tsv):
        exp = expected(directions(links[name]), d)
        p10 = rtt["rtt_ms"]["p10"]
        if p10 is None:
            if exp["loss"] != 1.0:  # a partition (100 % loss) answers nothing, as it should
                bad.append(f"{src} -> {dst} ({name}): no echo came back")
            continue
        if tput.get("bits_per_second") is None and exp["loss"] != 1.0:
            bad.append(f"{src} -> {dst} ({name}): the TCP bulk transfer failed")
        loaded_p10 = loaded["rtt_ms"]["p10"] if loaded else None
        for what, ok in direction_checks(exp["out"], exp["back"], p10, tput.get("bits_per_second"), loaded_p10):
            if not ok:
                bad.append(f"{src} -> {dst} ({name}): {what} does not hold")
    for b in bad:
        print(f"FAILED: demo: measured outside what a link in force guarantees: {b}")
    return 1 if bad else 0


def _pct(x):
    return f"{x * 100:.2f} %"


def loss_cell(measured_ratio, sent, p):
    """Measured loss with the band 95 % of runs of `sent` probes fall in when each is lost with probability p."""
    if p is None:
        return f"{measured_ratio * 100:.2f} % of {sent} (Gilbert-Elliott: no band)"
    sd = (p * (1 - p) / sent) ** 0.5 if sent else 0.0
    lo, hi = max(0.0, p - 1.96 * sd), p + 1.96 * sd
    return f"{measured_ratio * 100:.2f} % of {sent} (95 %: {lo * 100:.2f}-{hi * 100:.2f})"


def _rate(bps):
    return f"{bps / 1e9:.2f} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:.2f} Mbit/s"


def _way_cell(way):
    lat = f"{way['latency_ms']:g} ms" + (f" ± {way['jitter_ms']:g}" if way["jitter_ms"] else "")
    loss = "GE loss" if way["loss"] is None else (f"{way['loss'] * 100:g} % loss" if way["loss"] else "")
    rate = (f"{way['rate_bps'] / 1e9:g} Gbit/s" if way["rate_bps"] >= 1e9 else f"{way['rate_bps'] / 1e6:g} Mbit/s") \
        if way["rate_bps"] else ""
    return ", ".join(x for x in (lat, loss, rate) if x)


def report_rows(measured_tsv, links):
    """The table: configured vs measured per pair and direction; a queue column where a direction is loaded."""
    rows, notes = [], []
    measured = list(_measured(measured_tsv))
    with_queue = any(m[6] is not None for m in measured)
    head = ["pair", "link status", "configured out / back", "RTT expected", "RTT p50 measured",
            "loss expected (round trip)", "loss measured", "goodput ceiling", "goodput measured"]
    if with_queue:
        head += ["queueLimit", "RTT under bulk expected", "RTT under bulk p50 (loss)"]
    rows.append(head)
    for name, d, src, dst, rtt, tput, loaded in measured:
        link = links[name]
        exp = expected(directions(link), d)
        conds = {c["type"]: c for c in (link.get("status") or {}).get("conditions", [])}
        deg = conds.get("Degraded", {})
        degraded = deg.get("status") == "True"
        status = "Degraded" if degraded else ("Ready" if conds.get("Ready", {}).get("status") == "True" else "Pending")
        note = f"{name}: Degraded ({deg.get('reason')}): {deg.get('message')}"
        if degraded and note not in notes:
            notes.append(note)
        no_netem = degraded and "sch_netem" in (deg.get("message") or "")
        netem_figures = exp["rtt_ms"] or exp["loss"] != 0.0
        p50 = rtt["rtt_ms"]["p50"]
        rtt_exp = f"{exp['rtt_ms']:g} ms" + (f" ± {exp['spread_ms']:g}" if exp["spread_ms"] else "")
        if netem_figures and no_netem:
            rtt_meas = loss_meas = "not applied: node kernel lacks sch_netem (status: Degraded)"
        else:
            rtt_meas = f"{p50:.2f} ms" if p50 is not None else "no echo"
            loss_meas = loss_cell(rtt["loss_ratio"], rtt["sent"], exp["loss"])
        rate = exp["rate_bps"]
        gp = tput.get("bits_per_second")
        row = [f"{src} -> {dst}", status,
               f"{_way_cell(exp['out']) or 'none'} / {_way_cell(exp['back']) or 'none'}",
               rtt_exp if exp["rtt_ms"] else "- (no latency)", rtt_meas,
               "GE" if exp["loss"] is None else _pct(exp["loss"]), loss_meas,
               _rate(rate * PAYLOAD / FRAME) if rate else "- (no rate)",
               _rate(gp) if gp is not None else "-"]
        if with_queue:
            if loaded:
                lp50 = loaded["rtt_ms"]["p50"]
                row += [str(exp["queue_limit"]), f"{exp['loaded_rtt_ms']:.0f} ms if the queue fills",
                        (f"{lp50:.2f} ms" if lp50 is not None else "no echo") + f" ({loaded['loss_ratio'] * 100:.1f} % lost)"]
            else:
                row += [str(exp["queue_limit"] or "-"), "-", "-"]
        rows.append(row)
    return rows, notes


def report(measured_tsv, links_json):
    links = _links(links_json)
    rows, notes = report_rows(measured_tsv, links)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(widths[j]) for j, c in enumerate(r)).rstrip())
        if i == 0:
            print("  ".join("-" * wd for wd in widths))
    print()
    print("RTT: UDP echo from the pair's first pod, out through this direction and back through the other.")
    print("goodput: TCP at the receiver; a rate counts whole frames, so the ceiling is 1448/1514 of it.")
    if len(rows[0]) > 9:
        print("under bulk: UDP echoes while the same pod sends TCP bulk the same way, which fills the direction's")
        print("queue; expected max(queueLimit x 1514 B x 8 / rate, one way latency + jitter) + the way back.")
        print("A direction with a queueLimit reports that bulk transfer's goodput.")
    for n in notes:
        print(n)
    return 0


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "wait":
        sys.exit(wait(sys.argv[2], float(sys.argv[3]), sys.argv[4:]))
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    if len(sys.argv) == 4 and sys.argv[1] == "report":
        sys.exit(report(sys.argv[2], sys.argv[3]))
    if len(sys.argv) == 4 and sys.argv[1] == "pairs":
        with open(sys.argv[2]) as links, open(sys.argv[3]) as pods:
            found = pairs(json.load(links), json.load(pods))
        for p in found:
            print("\t".join(str(int(x)) if isinstance(x, bool) else str(x) for x in p))
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "namespace":
        with open(sys.argv[2]) as f:
            ns = namespace_of(f.read())
        if ns is None:
            sys.exit(f"demo: {sys.argv[2]} names no namespace")
        print(ns)
        sys.exit(0)
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
