#!/usr/bin/env python3
"""Tests of e2e/failures.py against logs shaped like each harness's output (run by `make unit`)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from failures import MAX_LINES, WIDTH, summarize  # noqa: E402

LIBTEST = """\
running 3 tests
test a::ok_one ... ok
test a::bad_one ... FAILED
test b::bad_two ... FAILED

failures:

---- a::bad_one stdout ----
some output
thread 'a::bad_one' panicked at operator/tests/x.rs:10:5:
timed out after 60s waiting for pods counted per region
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace

---- b::bad_two stdout ----
thread 'b::bad_two' panicked at operator/tests/y.rs:3:9: assertion failed: x == 2

failures:
    a::bad_one
    b::bad_two

test result: FAILED. 1 passed; 2 failed; 0 ignored
"""

NETEM = """\
==== scenario rescheduling
thread 'main' panicked at e2e/suite/tests/netem/scenarios/lifecycle.rs:120:9:
inconclusive: the window ended at +3000 ms
==== scenario rescheduling: FAILED in 40.1s

netem scenarios:
  rescheduling FAILED 40.1s
FAILED: scenario rescheduling: inconclusive: the window ended at +3000 ms (lifecycle.rs:120)
netem: 0 passed, 1 failed
"""

RIG = """\
== bookworm (qemu): 31 of 32 ok
FAILED: bookworm/delay.tc: median 31.2 ms (20 ms)
RESULT: FAIL
"""

COMPILE = """\
   Compiling isthmus-agent v0.1.0
error[E0308]: mismatched types
  --> agent/src/lib.rs:3:5
error: could not compile `isthmus-agent`
"""

SCRIPT = """\
[e2e 10:00:00] cluster up
cluster: timed out after 180s waiting for isthmus-node1 Ready
make: *** [Makefile:110: e2e] Error 1
"""


class Summarize(unittest.TestCase):
    def test_libtest_names_each_failed_test_with_its_panic(self):
        self.assertEqual(
            summarize(LIBTEST),
            [
                "test a::bad_one: timed out after 60s waiting for pods counted per region (operator/tests/x.rs:10)",
                "test b::bad_two: assertion failed: x == 2 (operator/tests/y.rs:3)",
            ],
        )

    def test_own_failed_lines_come_first_and_alone(self):
        self.assertEqual(
            summarize(NETEM),
            ["scenario rescheduling: inconclusive: the window ended at +3000 ms (lifecycle.rs:120)"],
        )
        self.assertEqual(summarize(RIG), ["bookworm/delay.tc: median 31.2 ms (20 ms)"])

    def test_compile_errors(self):
        self.assertEqual(
            summarize(COMPILE), ["compile error: mismatched types", "compile error: could not compile `isthmus-agent`"]
        )

    def test_a_script_says_why_it_stopped(self):
        self.assertEqual(summarize(SCRIPT)[0], "cluster: timed out after 180s waiting for isthmus-node1 Ready")

    def test_without_any_marker_the_last_lines_stand_in(self):
        self.assertEqual(summarize("a\n\nb\nc\nd\n"), ["b", "c", "d"])

    def test_bounded_in_count_and_width(self):
        many = "".join(f"FAILED: t{i}: {'x' * 500}\n" for i in range(20))
        out = summarize(many)
        self.assertEqual(len(out), MAX_LINES)
        self.assertTrue(all(len(line) <= WIDTH for line in out))
        self.assertIn("13 more", out[-1])


if __name__ == "__main__":
    unittest.main()
