#!/usr/bin/env python3
"""Tests of e2e/demo_links.py: which link states the demo waits out, which stop it, its one-sided checks, and what
it measures (pairs and directions) and expects of each direction."""
import contextlib
import glob
import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from demo_links import (bits, check, checks, direction_checks, directions, expected, ms, namespace_of,  # noqa: E402
                        pairs, report_rows, state)

import yaml  # `make unit` installs PyYAML where it is missing


def link(ready, degraded=None, gen=2, observed=2, pairs=2, applied=2):
    conds = [{"type": "Ready", "status": ready[0], "reason": ready[1], "message": "m", "observedGeneration": observed}]
    if degraded:
        conds.append({"type": "Degraded", "status": degraded[0], "reason": degraded[1], "message": "d",
                      "observedGeneration": observed})
    return {"metadata": {"name": "l", "generation": gen},
            "status": {"conditions": conds, "pairs": pairs, "pairsApplied": applied}}


class State(unittest.TestCase):
    def test_applied_with_every_pair_is_done(self):
        self.assertEqual(state(link(("True", "Applied")))[0], "done")
        self.assertEqual(state(link(("True", "Applied"), applied=1))[0], "final")

    def test_a_settling_cluster_is_waited_out(self):
        self.assertEqual(state(link(("False", "Pending")))[0], "wait")
        self.assertEqual(state(link(("True", "NoPairs"), pairs=0, applied=0))[0], "wait")
        for reason in ("AgentUnavailable", "AgentUnreachable", "PodNotFound", "InterfaceNotFound"):
            self.assertEqual(state(link(("False", "Failed"), ("True", reason)))[0], "wait", reason)
        self.assertEqual(state(link(("True", "Applied"), observed=1))[0], "wait", "an older generation's status")
        self.assertEqual(state({"metadata": {"name": "l", "generation": 1}})[0], "wait", "no status yet")

    def test_what_waiting_cannot_change_is_final_and_named(self):
        for reason in ("KernelUnsupported", "ForeignQdisc", "DuplicateRestriction", "HostNetwork"):
            verdict, brief, words = state(link(("False", "Failed"), ("True", reason)))
            self.assertEqual(verdict, "final", reason)
            self.assertEqual(brief, f"l: Ready=False Failed, Degraded {reason}")
            self.assertEqual(words, f"l: Ready=False Failed (m); Degraded {reason}: d")
        self.assertEqual(state(link(("False", "InvalidSpec"), ("True", "InvalidSpec")))[0], "final")


class Checks(unittest.TestCase):
    def test_units(self):
        self.assertEqual((ms("120ms"), ms("1.5s"), ms("500us")), (120.0, 1500.0, 0.5))
        self.assertEqual((bits("100Mbit"), bits("1Gbit"), bits("512kbit")), (100e6, 1e9, 512e3))
        with self.assertRaises(ValueError):
            bits("100")

    def test_a_link_not_in_force_fails_and_one_in_force_passes(self):
        imp = {"latency": "40ms", "bandwidth": "100Mbit"}
        self.assertEqual([ok for _, ok in checks(imp, True, 1.29, 343.6e6)], [False, False])
        self.assertEqual([ok for _, ok in checks(imp, True, 80.9, 94e6)], [True, True])
        # jitter lowers the floor by its amount, each way
        self.assertEqual(checks({"latency": "120ms", "jitter": "5ms"}, True, 231.0, 1e9)[0][1], True)
        self.assertEqual(checks({"latency": "120ms", "jitter": "5ms"}, False, 114.0, 1e9)[0][1], False)
        self.assertEqual(checks({"loss": {"percent": "1%"}}, True, 0.5, 1e9), [])


def nl(name, spec, status=None):
    return {"metadata": {"name": name, "generation": 1}, "spec": spec, "status": status or {}}


def sel(**labels):
    return {"podSelector": {"matchLabels": labels}}


def pod(name, ip, **labels):
    return {"metadata": {"name": name, "labels": labels}, "status": {"podIP": ip}}


def rtt_report(p10, p50=None, loss=0.0, sent=1000):
    return {"sent": sent, "loss_ratio": loss, "rtt_ms": {"p10": p10, "p50": p50 if p50 is not None else p10}}


# `profile: lte` with the overrides of examples/lossy-lte-uplink.yaml, and the status the operator writes for it.
LTE = nl("lte", {"from": sel(app="phone"), "to": sel(app="api"), "profile": "lte",
                 "impairment": {"bandwidth": "5Mbit", "jitter": "8ms", "loss": {"percent": "1.5%"}},
                 "reverse": {"jitter": "4ms", "loss": {"percent": "0.2%"}}},
         {"latency": "65ms±8ms/50ms±4ms", "loss": "1.5%/0.2%", "bandwidth": "5Mbit/50Mbit",
          "expectedRoundTrip": "115ms ± 12ms"})
DEEP = nl("deep", {"from": sel(end="deep-a"), "to": sel(end="deep-b"), "symmetric": True,
                   "impairment": {"latency": "20ms", "bandwidth": "10Mbit", "queueLimit": 1000}})


class Directions(unittest.TestCase):
    def test_the_status_resolves_a_profile_each_way(self):
        up, down = directions(LTE)
        self.assertEqual((up["latency_ms"], up["jitter_ms"], up["rate_bps"]), (65.0, 8.0, 5e6))
        self.assertEqual((down["latency_ms"], down["jitter_ms"], down["rate_bps"]), (50.0, 4.0, 50e6))
        self.assertAlmostEqual(up["loss"], 0.015)
        self.assertAlmostEqual(down["loss"], 0.002)
        e = expected(directions(LTE), 0)
        self.assertEqual((e["rtt_ms"], e["spread_ms"], e["rate_bps"]), (115.0, 12.0, 5e6))
        self.assertAlmostEqual(e["loss"], 1 - 0.985 * 0.998)
        self.assertEqual(expected(directions(LTE), 1)["rate_bps"], 50e6, "from the api: the downlink's rate")

    def test_without_a_status_the_spec_gives_each_direction(self):
        fwd, rev = directions(DEEP)
        self.assertEqual(fwd, rev)
        self.assertEqual(fwd["queue_limit"], 1000)
        sat = nl("sat", {"from": sel(site="t"), "to": sel(site="g"),
                         "impairment": {"latency": "300ms", "bandwidth": "2Mbit"},
                         "reverse": {"latency": "300ms", "bandwidth": "20Mbit", "loss": {"percent": "0.1%"}}})
        self.assertEqual([w["rate_bps"] for w in directions(sat)], [2e6, 20e6])
        one_way = nl("up", {"from": sel(a="1"), "to": sel(b="2"), "impairment": {"bandwidth": "50Mbit"}})
        self.assertEqual(len(directions(one_way)), 1)
        e = expected(directions(one_way), 0)
        self.assertEqual((e["rtt_ms"], e["loss"], e["loaded_rtt_ms"]), (0.0, 0.0, None))
        ge = nl("ge", {"from": sel(a="1"), "to": sel(b="2"),
                       "impairment": {"loss": {"gilbertElliott": {"p": "1%", "r": "20%"}}}})
        self.assertIsNone(expected(directions(ge), 0)["loss"], "no band for bursty loss")

    def test_queue_under_load_is_the_full_queue_drained_at_the_rate(self):
        # 1000 frames × 1514 B × 8 / 10 Mbit/s = 1211.2 ms, then 20 ms back.
        self.assertAlmostEqual(expected(directions(DEEP), 0)["loaded_rtt_ms"], 1231.2)
        shallow = nl("s", dict(DEEP["spec"], impairment={"latency": "20ms", "bandwidth": "10Mbit", "queueLimit": 50}))
        self.assertAlmostEqual(expected(directions(shallow), 1)["loaded_rtt_ms"], 60.56 + 20)
        # a queue shorter than the delay line: the delay is what a packet waits
        tiny = nl("t", dict(DEEP["spec"], impairment={"latency": "20ms", "bandwidth": "10Mbit", "queueLimit": 5}))
        self.assertAlmostEqual(expected(directions(tiny), 0)["loaded_rtt_ms"], 40.0)

    def test_a_queue_limit_the_node_cut_counts_as_installed(self):
        lfn = nl("lfn", {"from": sel(site="east"), "to": sel(site="west"), "symmetric": True,
                         "impairment": {"latency": "50ms", "bandwidth": "10Gbit", "queueLimit": 60000}},
                 {"latency": "50ms/50ms", "loss": "0%/0%", "bandwidth": "10Gbit/10Gbit", "queueLimitsCapped": 2,
                  "conditions": [{"type": "Ready", "status": "True", "reason": "Applied",
                                  "message": "2 pairs applied; the node's queue budget cut queueLimit on 2 of them "
                                             "(to 11081 packets from 60000 asked, e.g. towards 10.0.1.7/32)"}]})
        self.assertEqual([w["queue_limit"] for w in directions(lfn)], [11081, 11081])
        self.assertAlmostEqual(expected(directions(lfn), 0)["loaded_rtt_ms"], 100.0, msg="the delay line is longer")


class DirectionChecks(unittest.TestCase):
    def test_each_direction_against_its_own_rate_and_both_latencies(self):
        up, down = directions(LTE)
        # floor: (65 - 8) + (50 - 4) - 0.5 = 102.5 ms from either end
        self.assertEqual([ok for _, ok in direction_checks(up, down, 102.6, 4.7e6)], [True, True])
        self.assertEqual([ok for _, ok in direction_checks(up, down, 102.4, 9e6)], [False, False])
        self.assertEqual([ok for _, ok in direction_checks(down, up, 103.0, 9e6)], [True, True],
                         "9 Mbit/s is far under the downlink's rate")
        self.assertEqual(direction_checks(down, up, 103.0, None)[1:], [], "no goodput, nothing to judge")
        deep = directions(DEEP)
        self.assertEqual([ok for _, ok in direction_checks(deep[0], deep[1], 40.1, 9.5e6, 1100.0)],
                         [True, True, True])
        self.assertEqual([ok for _, ok in direction_checks(deep[0], deep[1], 40.1, 9.5e6, 3.0)][1], False,
                         "a round trip under bulk faster than the latencies breaks the link too")

    def test_the_old_symmetric_checks_are_the_same_as_per_direction(self):
        imp = {"latency": "40ms", "bandwidth": "100Mbit"}
        self.assertEqual(checks(imp, True, 80.9, 94e6),
                         direction_checks(*directions(nl("x", {"symmetric": True, "impairment": imp})), 80.9, 94e6))


class Pairs(unittest.TestCase):
    PODS = {"items": [pod("phone-1", "10.0.0.1", app="phone"), pod("api-1", "10.0.0.2", app="api"),
                      pod("a-1", "10.0.0.3", end="deep-a"), pod("b-1", "10.0.0.4", end="deep-b"),
                      {"metadata": {"name": "pending", "labels": {"app": "api"}}, "status": {}}]}

    def test_one_entry_per_direction_in_force_loaded_where_a_queue_limit_is(self):
        got = pairs({"items": [LTE, DEEP]}, self.PODS)
        self.assertEqual(got, [("lte", 0, "phone-1", "phone", "api", "10.0.0.2", False),
                               ("lte", 1, "api-1", "api", "phone", "10.0.0.1", False),
                               ("deep", 0, "a-1", "deep-a", "deep-b", "10.0.0.4", True),
                               ("deep", 1, "b-1", "deep-b", "deep-a", "10.0.0.3", True)])

    def test_one_way_cidr_and_other_namespace_links(self):
        links = {"items": [
            nl("up", {"from": sel(app="phone"), "to": sel(app="api"), "impairment": {"latency": "5ms"}}),
            nl("ext", {"from": sel(app="phone"), "to": {"cidrs": ["203.0.113.0/24"]}, "impairment": {}}),
            nl("far", {"from": sel(app="phone"), "to": dict(sel(app="api"), namespaceSelector={}),
                       "impairment": {}}),
            nl("nobody", {"from": sel(app="nobody"), "to": sel(app="api"), "impairment": {}, "symmetric": True})]}
        self.assertEqual(pairs(links, self.PODS), [("up", 0, "phone-1", "phone", "api", "10.0.0.2", False)])


class Examples(unittest.TestCase):
    def test_every_example_names_its_namespace(self):
        for path in sorted(glob.glob(os.path.join(HERE, "..", "examples", "*.yaml"))):
            with open(path) as f:
                text = f.read()
            ns = namespace_of(text)
            self.assertTrue(ns and f"namespace: {ns}" in text, path)

    def test_the_seed_examples_expect_what_their_headers_say(self):
        def links(name):
            with open(os.path.join(HERE, "..", "examples", name)) as f:
                docs = list(yaml.safe_load_all(f))
            return {d["metadata"]["name"]: d for d in docs if d and d["kind"] == "NetworkLink"}
        q = links("dummynet-queues.yaml")
        self.assertEqual(round(expected(directions(q["pipe-shallow"]), 0)["loaded_rtt_ms"]), 81)
        self.assertEqual(round(expected(directions(q["pipe-deep"]), 1)["loaded_rtt_ms"]), 1231)
        for link in q.values():
            self.assertEqual(expected(directions(link), 0)["rtt_ms"], 40.0)
        # the LTE link is profile-based: its status, not its spec, carries the rates (LTE above is that status)
        lte = links("lossy-lte-uplink.yaml")["phones-lte-lossy"]
        self.assertEqual(lte["spec"], LTE["spec"])


class Report(unittest.TestCase):
    def write(self, rows):
        f = tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False)
        self.addCleanup(os.unlink, f.name)
        for r in rows:
            f.write("\t".join(x if isinstance(x, str) else json.dumps(x) for x in r) + "\n")
        f.close()
        return f.name

    def test_rows_per_direction_with_a_queue_column_only_when_loaded(self):
        tsv = self.write([("lte", "0", "phone", "api", rtt_report(110.0, 115.2, 0.018), {"bits_per_second": 1.1e6}, "-"),
                          ("lte", "1", "api", "phone", rtt_report(110.0, 115.0, 0.016), {"bits_per_second": 3e6}, "-")])
        rows, notes = report_rows(tsv, {"lte": LTE})
        self.assertEqual(len(rows[0]), 9)
        self.assertEqual(rows[1][0], "phone -> api")
        self.assertEqual(rows[1][2], "65 ms ± 8, 1.5 % loss, 5 Mbit/s / 50 ms ± 4, 0.2 % loss, 50 Mbit/s")
        self.assertEqual((rows[1][3], rows[1][4], rows[1][5]), ("115 ms ± 12", "115.20 ms", "1.70 %"))
        self.assertEqual((rows[1][7], rows[2][7]), ("4.78 Mbit/s", "47.82 Mbit/s"))
        tsv = self.write([("deep", "0", "deep-a", "deep-b", rtt_report(40.2), {"bits_per_second": 9.5e6},
                           rtt_report(900.0, 1150.0, 0.02, 400))])
        rows, _ = report_rows(tsv, {"deep": DEEP})
        self.assertEqual(rows[1][9:], ["1000", "1231 ms if the queue fills", "1150.00 ms (2.0 % lost)"])

    def test_check_names_what_broke(self):
        links = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        self.addCleanup(os.unlink, links.name)
        json.dump({"items": [LTE]}, links)
        links.close()
        ok = self.write([("lte", "1", "api", "phone", rtt_report(110.0), {"bits_per_second": 9e6}, "-")])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(check(ok, links.name), 0, "9 Mbit/s down is within 50 Mbit/s")
        self.assertEqual(out.getvalue(), "")
        bad = self.write([("lte", "0", "phone", "api", rtt_report(110.0), {"bits_per_second": 9e6}, "-"),
                          ("lte", "1", "api", "phone", rtt_report(110.0), {"bits_per_second": None}, "-")])
        with contextlib.redirect_stdout(out):
            self.assertEqual(check(bad, links.name), 1, "9 Mbit/s up is over 5 Mbit/s; a failed transfer")
        self.assertIn("phone -> api (lte): goodput 9.0 <= 5.3 Mbit/s does not hold", out.getvalue())
        self.assertIn("api -> phone (lte): the TCP bulk transfer failed", out.getvalue())


if __name__ == "__main__":
    unittest.main()
