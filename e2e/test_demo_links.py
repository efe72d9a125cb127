#!/usr/bin/env python3
"""Tests of e2e/demo_links.py: which link states the demo waits out, which stop it, and its one-sided checks."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_links import bits, checks, ms, state  # noqa: E402


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


if __name__ == "__main__":
    unittest.main()
