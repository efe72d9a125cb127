#!/usr/bin/env python3
"""Tests of the image pipeline without a release build: e2e/cluster/build-image packs the static busybox the
way e2e/images/build packs isthmus's binaries, e2e/images/build_index.py joins per-platform archives into a
multi-platform one, and verify_archive.py must accept the results, find them deterministic, and reject archives
that are corrupted or say the wrong thing.

    python3 e2e/images/test_verify_archive.py      # needs /bin/busybox from busybox-static, tar, gzip, jq
"""

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_IMAGE = os.path.join(HERE, "..", "cluster", "build-image")
BUILD_INDEX = os.path.join(HERE, "build_index.py")
BUSYBOX = "/bin/busybox"
sys.path.insert(0, HERE)
import verify_archive  # noqa: E402

NAME = "localhost/isthmus-verify-test:1"


def build(out, *extra, tool=BUSYBOX):
    return subprocess.run(
        [BUILD_IMAGE, NAME, out, "--file", f"{tool}:/usr/local/bin/tool",
         "--entrypoint", "/usr/local/bin/tool", "--cmd", "serve", *extra],
        check=True, capture_output=True, text=True).stdout.strip()


def rewrite(archive, out, change):
    """Copies ARCHIVE to OUT with change(name, bytes) -> bytes applied to every file."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if data is not None:
                data = change(m.name, data)
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)


@unittest.skipUnless(os.access(BUSYBOX, os.X_OK) and shutil.which("jq"), "needs busybox-static and jq")
class PipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="isth-images-")
        cls.archive = os.path.join(cls.tmp, "image.tar")
        cls.digest = build(cls.archive, "--user", "65532:65532")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def verify(self, archive, **expect):
        return verify_archive.verify(archive, **expect)

    def test_a_built_archive_passes_every_check(self):
        summary = self.verify(self.archive, expect_name=NAME, expect_manifest_digest=self.digest,
                              expect_files=["/usr/local/bin/tool"], expect_user="65532:65532",
                              expect_entrypoint="/usr/local/bin/tool", expect_cmd=["serve"])
        self.assertEqual(summary["name"], NAME)
        self.assertEqual(summary["manifest_digest"], self.digest)
        listing = subprocess.run(["tar", "-tf", self.archive], check=True, capture_output=True, text=True).stdout
        self.assertIn("index.json", listing.split())
        self.assertIn("oci-layout", listing.split())
        self.assertIn(f"blobs/sha256/{self.digest.removeprefix('sha256:')}", listing.split())

    def test_the_same_inputs_give_the_same_bytes(self):
        again = os.path.join(self.tmp, "again.tar")
        self.assertEqual(build(again, "--user", "65532:65532"), self.digest)
        with open(self.archive, "rb") as a, open(again, "rb") as b:
            self.assertEqual(hashlib.sha256(a.read()).digest(), hashlib.sha256(b.read()).digest())

    def test_a_corrupted_blob_is_caught(self):
        bad = os.path.join(self.tmp, "corrupt.tar")
        config_blob = self.verify(self.archive)["config_digest"].removeprefix("sha256:")
        rewrite(self.archive, bad,
                lambda name, data: data.replace(b"65532", b"65533") if name.endswith(config_blob) else data)
        with self.assertRaises(verify_archive.Problems) as caught:
            self.verify(bad)
        self.assertTrue(any("hashes to" in p for p in caught.exception.problems), caught.exception.problems)

    def test_a_wrong_size_in_the_index_is_caught(self):
        bad = os.path.join(self.tmp, "size.tar")

        def shrink(name, data):
            if name == "index.json":
                index = json.loads(data)
                index["manifests"][0]["size"] -= 1
                return json.dumps(index).encode()
            return data

        rewrite(self.archive, bad, shrink)
        with self.assertRaises(verify_archive.Problems) as caught:
            self.verify(bad)
        self.assertTrue(any("size" in p for p in caught.exception.problems), caught.exception.problems)

    def test_expectations_that_do_not_hold_are_reported(self):
        with self.assertRaises(verify_archive.Problems) as caught:
            self.verify(self.archive, expect_name="localhost/other:1", expect_user="",
                        expect_files=["/usr/local/bin/missing"], expect_cmd=["rtt"])
        text = "\n".join(caught.exception.problems)
        for fragment in ("image name", "User", "/usr/local/bin/missing is missing", "Cmd"):
            self.assertIn(fragment, text)

    def test_dynamic_executables_are_told_from_static_ones(self):
        with open(shutil.which("tar"), "rb") as f:
            self.assertTrue(verify_archive.elf_interpreter_present(f.read()), "Debian's tar is dynamic")
        with open(BUSYBOX, "rb") as f:
            self.assertFalse(verify_archive.elf_interpreter_present(f.read()), "busybox-static is static")
        self.assertIsNone(verify_archive.elf_interpreter_present(b"#!/bin/sh\n"), "a script is no ELF")

    def test_copying_an_archive_unchanged_keeps_it_valid(self):
        # The corruption tests rewrite archives; this shows that their failures come from the change alone.
        copy = os.path.join(self.tmp, "copy.tar")
        rewrite(self.archive, copy, lambda name, data: data)
        self.verify(copy, expect_manifest_digest=self.digest, expect_files=["/usr/local/bin/tool"])

    def test_the_command_line_exits_non_zero_on_failure(self):
        ok = subprocess.run([sys.executable, os.path.join(HERE, "verify_archive.py"), self.archive,
                             "--expect-user", "65532:65532"], capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertEqual(json.loads(ok.stdout)["user"], "65532:65532")
        bad = subprocess.run([sys.executable, os.path.join(HERE, "verify_archive.py"), self.archive,
                              "--expect-user", ""], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("User", bad.stderr)


def build_index(out, *archives, name=NAME):
    return subprocess.run([sys.executable, BUILD_INDEX, name, out, *archives],
                          check=True, capture_output=True, text=True).stdout.strip()


@unittest.skipUnless(os.access(BUSYBOX, os.X_OK) and shutil.which("jq"), "needs busybox-static and jq")
class MultiPlatformTest(unittest.TestCase):
    """Image indexes as `make release-images` builds them: one amd64 and one arm64 manifest under one name.
    The arm64 executable is busybox-static with its ELF header's machine set to aarch64 (183): the verifier reads
    headers only, and this keeps the test free of a cross toolchain."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="isth-index-")
        cls.arm64_tool = os.path.join(cls.tmp, "busybox-arm64")
        with open(BUSYBOX, "rb") as f:
            data = bytearray(f.read())
        data[18:20] = (183).to_bytes(2, "little")
        with open(cls.arm64_tool, "wb") as f:
            f.write(data)
        os.chmod(cls.arm64_tool, 0o755)
        cls.amd64 = os.path.join(cls.tmp, "amd64.tar")
        cls.arm64 = os.path.join(cls.tmp, "arm64.tar")
        cls.amd64_digest = build(cls.amd64, "--user", "65532:65532", "--arch", "amd64")
        cls.arm64_digest = build(cls.arm64, "--user", "65532:65532", "--arch", "arm64", tool=cls.arm64_tool)
        cls.index = os.path.join(cls.tmp, "index.tar")
        cls.index_digest = build_index(cls.index, cls.amd64, cls.arm64)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    BOTH = ["linux/amd64", "linux/arm64"]

    def expectations(self, **override):
        expect = dict(expect_name=NAME, expect_files=["/usr/local/bin/tool"], expect_user="65532:65532",
                      expect_entrypoint="/usr/local/bin/tool", expect_cmd=["serve"], expect_platforms=self.BOTH)
        expect.update(override)
        return expect

    def test_an_index_of_two_platforms_passes_and_lists_each_manifest(self):
        summary = verify_archive.verify(self.index, expect_manifest_digest=self.index_digest, **self.expectations())
        self.assertEqual(summary["index_digest"], self.index_digest)
        self.assertEqual(sorted(summary["platforms"]), self.BOTH)
        # Each platform's manifest is byte for byte the one its single-platform archive carries.
        self.assertEqual(summary["platforms"]["linux/amd64"]["manifest_digest"], self.amd64_digest)
        self.assertEqual(summary["platforms"]["linux/arm64"]["manifest_digest"], self.arm64_digest)
        self.assertNotEqual(self.amd64_digest, self.arm64_digest)
        listing = subprocess.run(["tar", "-tf", self.index], check=True, capture_output=True, text=True).stdout
        self.assertNotIn("manifest.json", listing.split(), "docker load takes one platform; no manifest.json")

    def test_the_single_platform_archives_declare_their_platform(self):
        verify_archive.verify(self.arm64, **self.expectations(expect_platforms=["linux/arm64"]))
        with self.assertRaises(verify_archive.Problems) as caught:
            verify_archive.verify(self.arm64, **self.expectations(expect_platforms=["linux/amd64"]))
        self.assertTrue(any("platforms" in p for p in caught.exception.problems), caught.exception.problems)

    def test_the_same_inputs_in_any_order_give_the_same_bytes(self):
        again = os.path.join(self.tmp, "again.tar")
        self.assertEqual(build_index(again, self.arm64, self.amd64), self.index_digest)
        with open(self.index, "rb") as a, open(again, "rb") as b:
            self.assertEqual(hashlib.sha256(a.read()).digest(), hashlib.sha256(b.read()).digest())

    def test_a_missing_platform_is_reported(self):
        only = os.path.join(self.tmp, "only-amd64.tar")
        build_index(only, self.amd64)
        with self.assertRaises(verify_archive.Problems) as caught:
            verify_archive.verify(only, **self.expectations())
        self.assertTrue(any("platforms ['linux/amd64']" in p for p in caught.exception.problems),
                        caught.exception.problems)

    def test_a_binary_for_another_architecture_is_caught(self):
        # An arm64 manifest around the x86-64 busybox: it would fail only when a node pulls it.
        wrong = os.path.join(self.tmp, "wrong-arm64.tar")
        build(wrong, "--user", "65532:65532", "--arch", "arm64")
        index = os.path.join(self.tmp, "wrong-index.tar")
        build_index(index, self.amd64, wrong)
        with self.assertRaises(verify_archive.Problems) as caught:
            verify_archive.verify(index, **self.expectations())
        self.assertTrue(any(p.startswith("arm64 rootfs") and "ELF machine 62" in p
                            for p in caught.exception.problems), caught.exception.problems)

    def test_a_root_user_on_one_platform_is_caught(self):
        # The operator must run as non-root on every platform, not only on the one a test cluster runs.
        root_arm64 = os.path.join(self.tmp, "root-arm64.tar")
        build(root_arm64, "--arch", "arm64", tool=self.arm64_tool)
        index = os.path.join(self.tmp, "root-index.tar")
        build_index(index, self.amd64, root_arm64)
        with self.assertRaises(verify_archive.Problems) as caught:
            verify_archive.verify(index, **self.expectations())
        self.assertEqual([p for p in caught.exception.problems if "User" in p],
                         ["arm64 config: User '', expected '65532:65532'"])

    def test_a_platform_that_is_not_the_configs_is_caught(self):
        # index.json claims arm64 for an amd64 image (index.json is no blob, so no digest changes).
        def claim_arm64(name, data):
            if name == "index.json":
                index = json.loads(data)
                index["manifests"][0]["platform"]["architecture"] = "arm64"
                return json.dumps(index).encode()
            return data

        bad = os.path.join(self.tmp, "claims-arm64.tar")
        rewrite(self.amd64, bad, claim_arm64)
        with self.assertRaises(verify_archive.Problems) as caught:
            verify_archive.verify(bad, expect_platforms=["linux/arm64"])
        self.assertTrue(any("architecture 'amd64'" in p for p in caught.exception.problems),
                        caught.exception.problems)

    def test_the_command_line_prints_both_platforms(self):
        ok = subprocess.run([sys.executable, os.path.join(HERE, "verify_archive.py"), self.index,
                             "--expect-platform", "linux/amd64", "--expect-platform", "linux/arm64",
                             "--expect-user", "65532:65532"], capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertEqual(sorted(json.loads(ok.stdout)["platforms"]), self.BOTH)
        bad = subprocess.run([sys.executable, os.path.join(HERE, "verify_archive.py"), self.index,
                              "--expect-user", "65532:65532"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1, "the default expectation is linux/amd64 alone")
        self.assertIn("platforms", bad.stderr)


if __name__ == "__main__":
    unittest.main()
