#!/usr/bin/env python3
"""The cluster's Kubernetes versions (run by `make unit`): v1.34.12 for everything, and v1.32.13, the oldest
supported, for the control-plane-only clusters of `make min-k8s` (e2e/cluster/README.md).

Each version's module pins one Kubernetes release and maps every staging module to that release's tags, and
install-k8s.sh builds each from its own module; versions without a module, and clusters the older version's
binaries cannot run, are refused before anything is built or started.
"""
import os
import re
import subprocess
import tempfile
import unittest

E2E = os.path.dirname(os.path.abspath(__file__))
CLUSTER_HOME = os.path.join(E2E, "cluster")
INSTALL = os.path.join(CLUSTER_HOME, "lib", "install-k8s.sh")
# module directory -> the Kubernetes version it builds
MODULES = {"k8s": "v1.34.12", "k8s-1.32": "v1.32.13"}


def read(*path):
    with open(os.path.join(CLUSTER_HOME, *path)) as f:
        return f.read()


class Modules(unittest.TestCase):
    def test_each_module_pins_its_release_and_the_staging_modules_to_its_tags(self):
        for module, version in MODULES.items():
            gomod = read(module, "go.mod")
            self.assertIn(f"\tk8s.io/kubernetes {version}\n", gomod, module)
            minor = version.split(".")[1]
            replaces = re.findall(r"^\t(k8s\.io/[\w.-]+) => k8s\.io/[\w.-]+ (v\S+)$", gomod, re.M)
            self.assertGreaterEqual(len(replaces), 29, module)
            for name, tag in replaces:
                self.assertTrue(tag.startswith(f"v0.{minor}."), f"{module}: {name} => {tag}")
            self.assertTrue(os.path.getsize(os.path.join(CLUSTER_HOME, module, "go.sum")) > 0, module)

    def test_install_k8s_builds_each_version_from_its_module(self):
        script = read("lib", "install-k8s.sh")
        for module, version in MODULES.items():
            self.assertRegex(script, rf"\n  {re.escape(version)}\)\n(?:    #.*\n)*    MODULE=\$HERE/{re.escape(module)}\n")
        self.assertIn("K8S_VERSION=${ISTHMUS_K8S_VERSION:-v1.34.12}", script)
        self.assertIn("DEFAULT_K8S_VERSION=v1.34.12", read("lib", "common.sh"))


class Refusals(unittest.TestCase):
    def run_env(self, argv, **env):
        e = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
        e.update(env)
        return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=60)

    def test_a_version_without_a_module_is_refused(self):
        with tempfile.TemporaryDirectory() as cache:
            r = self.run_env([INSTALL], ISTHMUS_K8S_VERSION="v1.31.0", ISTHMUS_CACHE=cache)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("only v1.34.12 and v1.32.13", r.stderr)
            self.assertEqual(os.listdir(cache), [])

    def test_the_older_version_runs_only_a_local_control_plane(self):
        with tempfile.TemporaryDirectory() as run_dir:
            for provider, args in (("local", []), ("kind", ["--control-plane-only"])):
                r = self.run_env([os.path.join(CLUSTER_HOME, "cluster"), "up", *args], ISTHMUS_K8S_VERSION="v1.32.13",
                                 ISTHMUS_CLUSTER_PROVIDER=provider, ISTHMUS_CLUSTER_NAME="k8s-versions-test",
                                 ISTHMUS_CLUSTER_DIR=os.path.join(run_dir, "c"))
                self.assertEqual(r.returncode, 1, (provider, r.stderr))
                self.assertIn("runs only a control-plane-only cluster of the local (or vm) provider", r.stderr)
                self.assertFalse(os.path.exists(os.path.join(run_dir, "c")), provider)


if __name__ == "__main__":
    unittest.main()
