#!/usr/bin/env python3
"""Tests of `e2e/cluster/cluster preflight` and of who calls it (run by `make unit`).

The local provider's full cluster needs cgroup v1 or hybrid (e2e/cluster/README.md): on a machine that boots with
cgroup v2 only, `cluster up`, `make test` and `make demo` must stop at once, saying what is missing and the ways
out, instead of half an hour in. The mount table comes from fake files (ISTHMUS_PROC_MOUNTS). What runs `up` or
the stages does so in a copy of the scripts whose install steps, `make` and cluster commands other than
`preflight` and `up` only record that they were reached: nothing here builds, starts or takes down a cluster.
"""
import os
import shutil
import subprocess
import tempfile
import unittest

E2E = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(E2E, "cluster", "cluster")
ROOT = os.geteuid() == 0
NEEDS_ROOT = "the local and vm providers need root before anything else is checked"

# /proc/mounts as each layout shows it (systemd's three; a machine's other mounts do not matter).
V2_ONLY = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0
"""
HYBRID = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,size=4096k,nr_inodes=1024,mode=755,inode64 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,nosuid,nodev,noexec,relatime,xattr,name=systemd 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,nodev,noexec,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,nosuid,nodev,noexec,relatime,pids 0 0
"""
V1 = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
"""
# Hybrid with the memory controller left to the v2 hierarchy: kubelet still refuses.
NO_V1_MEMORY = "".join(l for l in HYBRID.splitlines(keepends=True) if not l.endswith(",memory 0 0\n"))
# A v1 tree over-mounted by cgroup2 at /sys/fs/cgroup: kubelet sees the last, and takes its v2 path.
V2_OVER_V1 = V1 + "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"

# What the message must name: the requirement, why, and each way out.
REQUIREMENT = ["cgroup v1", "kubelet", "cpu, cpuacct, cpuset and memory"]
WAYS_OUT = ["ISTHMUS_CLUSTER_PROVIDER=vm", "ISTHMUS_CLUSTER_PROVIDER=kind", "systemd.unified_cgroup_hierarchy=0",
            "SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1"]

STUB = """#!/bin/sh
echo "$0 $*" >>"{marker}"
{tail}
"""


class Preflight(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="isthmus-preflight-test.")
        cls.tables = {}
        for name, text in [("v2", V2_ONLY), ("hybrid", HYBRID), ("v1", V1), ("no-v1-memory", NO_V1_MEMORY),
                           ("v2-over-v1", V2_OVER_V1)]:
            path = os.path.join(cls.tmp, name)
            with open(path, "w") as f:
                f.write(text)
            cls.tables[name] = path
        cls.tree = cls.make_tree(os.path.join(cls.tmp, "tree"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def make_tree(cls, t):
        """A copy of run-stages and the cluster scripts in which only `preflight` and `up` are real, up to
        `up`'s install step; everything else records its call in t/calls and succeeds."""
        os.makedirs(os.path.join(t, "e2e", "cluster"))
        os.makedirs(os.path.join(t, "bin"))
        shutil.copy2(os.path.join(E2E, "run-stages"), os.path.join(t, "e2e"))
        shutil.copy2(os.path.join(E2E, "failures.py"), os.path.join(t, "e2e"))
        shutil.copytree(os.path.join(E2E, "cluster", "lib"), os.path.join(t, "e2e", "cluster", "lib"))
        shutil.copy2(CLUSTER, os.path.join(t, "e2e", "cluster", "cluster.real"))
        calls = os.path.join(t, "calls")

        def stub(path, tail):
            with open(path, "w") as f:
                f.write(STUB.format(marker=calls, tail=tail))
            os.chmod(path, 0o755)

        stub(os.path.join(t, "e2e", "cluster", "cluster"),
             'case $1 in preflight|up) exec "$(dirname "$0")/cluster.real" "$@" ;; esac')
        for script in ("install-debs.sh", "install-k8s.sh"):
            stub(os.path.join(t, "e2e", "cluster", "lib", script), "exit 1")
        stub(os.path.join(t, "bin", "make"), "exit 0")
        return t

    def setUp(self):
        calls = os.path.join(self.tree, "calls")
        if os.path.exists(calls):
            os.unlink(calls)

    def raw_calls(self):
        """Each recorded call: the stub's path, then its arguments."""
        try:
            with open(os.path.join(self.tree, "calls")) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def calls(self):
        return [l.split(" ", 1)[1] if " " in l else "" for l in self.raw_calls()]

    def run_cmd(self, argv, table, provider="local", **env):
        e = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
        e.update(ISTHMUS_PROC_MOUNTS=self.tables.get(table, table), ISTHMUS_CLUSTER_NAME="preflight-test",
                 ISTHMUS_CLUSTER_DIR=os.path.join(self.tmp, "run-dir"),
                 PATH=os.path.join(self.tree, "bin") + os.pathsep + e.get("PATH", "/usr/bin:/bin"))
        if provider is not None:
            e["ISTHMUS_CLUSTER_PROVIDER"] = provider
        e.update(env)
        return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=60)

    def preflight(self, table, provider="local"):
        return self.run_cmd([CLUSTER, "preflight"], table, provider)

    def assert_refused(self, r, *extra):
        self.assertEqual(r.returncode, 1, r.stderr)
        for s in REQUIREMENT + WAYS_OUT + list(extra):
            self.assertIn(s, r.stderr)

    # ---- the check itself
    def test_cgroup_v2_only_is_refused_naming_the_requirement_and_the_ways_out(self):
        r = self.preflight("v2")
        self.assert_refused(r, "cgroup v2 only", self.tables["v2"])
        missing = [l for l in r.stderr.splitlines() if "missing:" in l]
        self.assertTrue(any("cpu, cpuacct, cpuset, memory" in l for l in missing), r.stderr)

    def test_a_v1_tree_under_a_cgroup2_mount_is_refused(self):
        self.assert_refused(self.preflight("v2-over-v1"), "cgroup v2 only")

    def test_a_controller_left_on_v2_is_named(self):
        r = self.preflight("no-v1-memory")
        self.assert_refused(r)
        missing = [l for l in r.stderr.splitlines() if "missing:" in l and "cgroup" in l]
        self.assertEqual(len(missing), 1, r.stderr)
        self.assertIn("hierarchies of memory ", missing[0])
        self.assertNotIn("cpu", missing[0])

    @unittest.skipUnless(ROOT, NEEDS_ROOT)
    def test_hybrid_and_v1_pass(self):
        for table in ("hybrid", "v1"):
            r = self.preflight(table)
            self.assertEqual(r.returncode, 0, f"{table}: {r.stderr}")
            self.assertIn("a full cluster can run here", r.stderr)
            self.assertNotIn("ways out", r.stderr)

    def test_an_unreadable_mount_table_fails(self):
        missing = os.path.join(self.tmp, "no-such-table")
        r = self.preflight(missing)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(missing, r.stderr)

    @unittest.skipUnless(ROOT, NEEDS_ROOT)
    def test_vm_and_kind_do_not_need_cgroup_v1(self):
        for provider in ("vm", "kind"):
            r = self.preflight("v2", provider)
            self.assertEqual(r.returncode, 0, f"{provider}: {r.stderr}")
            self.assertIn(f"preflight: {provider}:", r.stderr)

    # ---- `up`
    @unittest.skipUnless(ROOT, NEEDS_ROOT)
    def test_up_stops_before_installing_or_creating_anything(self):
        r = self.run_cmd([os.path.join(self.tree, "e2e", "cluster", "cluster"), "up"], "v2")
        self.assert_refused(r)
        self.assertEqual([c for c in self.calls() if c != "up"], [], "up went on past the preflight")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "run-dir")))

    @unittest.skipUnless(ROOT, NEEDS_ROOT)
    def test_a_control_plane_only_cluster_needs_no_cgroup_v1(self):
        r = self.run_cmd([os.path.join(self.tree, "e2e", "cluster", "cluster"), "up", "--control-plane-only"], "v2")
        self.assertNotIn("ways out", r.stderr)
        # It went on to its install step (a stub here, which stops it).
        self.assertTrue(any("install-debs.sh" in l for l in self.raw_calls()), r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "run-dir")))

    # ---- make test (run-stages)
    def run_stages(self, table, *stages, provider="local"):
        self.logs = os.path.join(self.tmp, "test-logs-" + self._testMethodName)
        return self.run_cmd([os.path.join(self.tree, "e2e", "run-stages"), *stages], table, provider,
                            ISTHMUS_TEST_LOGS=self.logs)

    def stages_run(self):
        return [c.split()[-1] for c in self.calls() if c.startswith("--no-print-directory")]

    def test_make_test_stops_before_its_first_stage(self):
        r = self.run_stages("v2", "unit", "chart-lint", "cluster-smoke", "e2e", "e2e-vm")
        self.assert_refused(r)
        self.assertEqual(self.stages_run(), [])
        self.assertNotIn("==== make", r.stderr)
        self.assertIn("stopped before the first stage", r.stderr)
        # Asked once for the two stages of one provider.
        self.assertEqual(r.stderr.count("the local provider cannot run"), 1, r.stderr)
        self.assertFalse(os.path.exists(self.logs))
        if ROOT:  # e2e-vm's provider, vm, needs no cgroup v1 (only root)
            self.assertIn("cluster-smoke e2e need a full cluster", r.stderr)
            self.assertIn('make test TEST_STAGES="unit chart-lint e2e-vm"', r.stderr)

    @unittest.skipUnless(ROOT, NEEDS_ROOT)
    def test_make_test_checks_first_then_runs_every_stage_in_order(self):
        r = self.run_stages("hybrid", "unit", "cluster-smoke", "e2e-vm")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.stages_run(), ["unit", "cluster-smoke", "e2e-vm"])
        local, vm, first = (r.stderr.find(s) for s in ("preflight: local:", "preflight: vm:", "==== make unit"))
        self.assertTrue(0 <= local < first and 0 <= vm < first, r.stderr)

    @unittest.skipUnless(ROOT, NEEDS_ROOT)
    def test_make_test_on_cgroup_v2_with_the_vm_provider_runs(self):
        r = self.run_stages("v2", "unit", "cluster-smoke", "e2e", "e2e-vm", provider="vm")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.stages_run(), ["unit", "cluster-smoke", "e2e", "e2e-vm"])

    def test_stages_without_a_full_cluster_are_not_checked(self):
        r = self.run_stages("v2", "unit", "operator-it", "chart-lint", "examples-validate")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("preflight", r.stderr)
        self.assertEqual(self.stages_run(), ["unit", "operator-it", "chart-lint", "examples-validate"])


if __name__ == "__main__":
    unittest.main()
