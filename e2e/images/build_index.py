#!/usr/bin/env python3
"""Joins single-platform OCI image archives (from e2e/cluster/build-image) into one multi-platform archive.

    build_index.py NAME OUT.tar ARCHIVE...

OUT.tar is an OCI image layout in a tar whose index.json names one image index (NAME in the
io.containerd.image.name annotation, its tag in org.opencontainers.image.ref.name); that index lists each
ARCHIVE's manifest with its platform, and every blob is copied unchanged, so each platform's manifest digest is the
one its single-platform archive reports. This is the form `skopeo copy oci-archive:OUT.tar docker://REF` or
`oras cp --from-oci-layout` pushes as one multi-arch reference. No Docker manifest.json: `docker load` takes a single
platform (use the single-platform archive for that). Deterministic like build-image: sorted entries, owners 0:0,
mtime 0, so the same inputs give the same bytes. Prints the image index's digest. Stdlib only.
"""

import hashlib
import io
import json
import os
import sys
import tarfile

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


def fail(message):
    print(f"build_index: {message}", file=sys.stderr)
    sys.exit(1)


def read_archive(path):
    with tarfile.open(path, "r:") as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    name, out, archives = argv[0], argv[1], argv[2:]
    if "/" not in name or ":" not in name.rsplit("/", 1)[1]:
        fail(f"NAME must be a full reference with a registry part and a tag (got {name!r})")
    blobs, entries = {}, []
    for path in archives:
        files = read_archive(path)
        index = json.loads(files["index.json"])
        manifests = index.get("manifests") or []
        if len(manifests) != 1 or manifests[0].get("mediaType") != MANIFEST_TYPE:
            fail(f"{path}: expected one single-platform image manifest in index.json")
        top = manifests[0]
        platform = top.get("platform") or {}
        if not platform.get("os") or not platform.get("architecture"):
            fail(f"{path}: index.json's manifest has no platform")
        entries.append({"mediaType": MANIFEST_TYPE, "digest": top["digest"], "size": top["size"],
                        "platform": {"architecture": platform["architecture"], "os": platform["os"]}})
        for file_name, data in files.items():
            if file_name.startswith("blobs/sha256/"):
                blobs[file_name] = data
    platforms = [f"{e['platform']['os']}/{e['platform']['architecture']}" for e in entries]
    if len(set(platforms)) != len(platforms):
        fail(f"a platform is given twice: {platforms}")
    # Sorted by platform so that the order of the arguments does not change the digest.
    entries.sort(key=lambda e: (e["platform"]["os"], e["platform"]["architecture"]))
    image_index = json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": entries},
                             separators=(",", ":"), sort_keys=True).encode()
    digest = hashlib.sha256(image_index).hexdigest()
    blobs[f"blobs/sha256/{digest}"] = image_index
    tag = name.rsplit(":", 1)[1]
    top_index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [{
        "mediaType": INDEX_TYPE, "digest": f"sha256:{digest}", "size": len(image_index),
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}}]}
    files = dict(blobs)
    files["index.json"] = json.dumps(top_index, separators=(",", ":"), sort_keys=True).encode()
    files["oci-layout"] = b'{"imageLayoutVersion":"1.0.0"}'

    with open(out + ".tmp", "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        directories = sorted({"blobs", "blobs/sha256"})
        for path in directories + sorted(files):
            info = tarfile.TarInfo(path)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path in files:
                info.mode, info.size = 0o644, len(files[path])
                tar.addfile(info, io.BytesIO(files[path]))
            else:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
    os.replace(out + ".tmp", out)
    print(f"sha256:{digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
