#!/usr/bin/env python3
"""Tests of the image pipeline without a release build: e2e/cluster/build-image packs the static busybox the
way e2e/images/build packs isthmus's binaries, and verify_archive.py must accept the result, find it
deterministic, and reject archives that are corrupted or say the wrong thing.

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
BUSYBOX = "/bin/busybox"
sys.path.insert(0, HERE)
import verify_archive  # noqa: E402

NAME = "localhost/isthmus-verify-test:1"


def build(out, *extra):
    return subprocess.run(
        [BUILD_IMAGE, NAME, out, "--file", f"{BUSYBOX}:/usr/local/bin/tool",
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


if __name__ == "__main__":
    unittest.main()
