#!/usr/bin/env python3
"""Checks an OCI image archive (an OCI image layout in a tar) the way a runtime would read it.

    verify_archive.py ARCHIVE [--expect-name REF] [--expect-manifest-digest sha256:...]
                      [--expect-file PATH]... [--expect-user UID:GID | --expect-user ''] [--expect-entrypoint PATH]
                      [--expect-cmd ARG]...

Recomputes every digest and size: each blob against its name, index.json -> manifest -> config and layers,
each layer's diff_id over its uncompressed tar; checks the media types containerd expects, the
io.containerd.image.name annotation, the Docker-style manifest.json beside the index (for `docker load`), and in
the layers: expected files are static executables (no ELF interpreter), owners are root with time 0, /tmp is
world-writable and sticky, and a non-root user exists in /etc/passwd and /etc/group.
Prints one JSON line describing the image; exits 1 with every problem listed otherwise. Stdlib only.
"""

import argparse
import gzip
import hashlib
import io
import json
import sys
import tarfile

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.layer.v1.tar")
PT_INTERP = 3


class Problems(Exception):
    def __init__(self, problems):
        super().__init__("\n".join(problems))
        self.problems = problems


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def elf_interpreter_present(data):
    """True if the ELF file asks for a dynamic loader (PT_INTERP); None if it is not a 64-bit ELF."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    order = "little" if data[5] == 1 else "big"
    phoff = int.from_bytes(data[0x20:0x28], order)
    phentsize = int.from_bytes(data[0x36:0x38], order)
    phnum = int.from_bytes(data[0x38:0x3A], order)
    for i in range(phnum):
        start = phoff + i * phentsize
        if int.from_bytes(data[start:start + 4], order) == PT_INTERP:
            return True
    return False


def verify(archive, expect_name=None, expect_manifest_digest=None, expect_files=(), expect_user=None,
           expect_entrypoint=None, expect_cmd=None):
    problems = []
    check = lambda ok, message: ok or problems.append(message)

    with tarfile.open(archive, "r:") as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        files = {name: tar.extractfile(m).read() for name, m in members.items() if m.isfile()}

    for required in ("oci-layout", "index.json"):
        if required not in files:
            raise Problems([f"{archive}: no {required} at the top of the archive"])
    blobs = {}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            digest = "sha256:" + name.rsplit("/", 1)[1]
            check(sha256(data) == digest, f"blob {name}: content hashes to {sha256(data)}")
            blobs[digest] = data

    layout = json.loads(files["oci-layout"])
    check(layout.get("imageLayoutVersion") == "1.0.0", f"oci-layout: imageLayoutVersion is {layout}")

    def fetch(descriptor, what, media_types):
        digest, size = descriptor.get("digest"), descriptor.get("size")
        if digest not in blobs:
            raise Problems(problems + [f"{what}: blob {digest} is not in the archive"])
        check(len(blobs[digest]) == size, f"{what}: size {size} in the descriptor, {len(blobs[digest])} in the blob")
        check(descriptor.get("mediaType") in media_types,
              f"{what}: mediaType {descriptor.get('mediaType')!r}, expected one of {media_types}")
        return blobs[digest]

    index = json.loads(files["index.json"])
    check(index.get("schemaVersion") == 2, "index.json: schemaVersion is not 2")
    check(index.get("mediaType", INDEX_TYPE) == INDEX_TYPE, f"index.json: mediaType {index.get('mediaType')!r}")
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise Problems(problems + [f"index.json: {len(manifests)} manifests, expected exactly 1"])
    top = manifests[0]
    name = (top.get("annotations") or {}).get("io.containerd.image.name")
    check(name is not None, "index.json: no io.containerd.image.name annotation (ctr would import it unnamed)")
    if expect_name is not None:
        check(name == expect_name, f"index.json: image name {name!r}, expected {expect_name!r}")
    if expect_manifest_digest is not None:
        check(top.get("digest") == expect_manifest_digest,
              f"index.json: manifest {top.get('digest')}, the builder reported {expect_manifest_digest}")
    manifest = json.loads(fetch(top, "index.json manifests[0]", (MANIFEST_TYPE,)))
    check(manifest.get("schemaVersion") == 2, "manifest: schemaVersion is not 2")
    check(manifest.get("mediaType") == MANIFEST_TYPE, f"manifest: mediaType {manifest.get('mediaType')!r}")
    config = json.loads(fetch(manifest["config"], "manifest config", (CONFIG_TYPE,)))
    check(config.get("os") == "linux", f"config: os {config.get('os')!r}")
    check(config.get("architecture") == "amd64", f"config: architecture {config.get('architecture')!r}")

    layer_descriptors = manifest.get("layers") or []
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    check(len(layer_descriptors) == len(diff_ids),
          f"{len(layer_descriptors)} layers in the manifest but {len(diff_ids)} diff_ids in the config")
    rootfs = {}
    for i, descriptor in enumerate(layer_descriptors):
        blob = fetch(descriptor, f"manifest layers[{i}]", LAYER_TYPES)
        tar_bytes = gzip.decompress(blob) if descriptor.get("mediaType", "").endswith("+gzip") else blob
        if i < len(diff_ids):
            check(sha256(tar_bytes) == diff_ids[i], f"layer {i}: diff_id {diff_ids[i]}, content {sha256(tar_bytes)}")
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as layer:
            for m in layer.getmembers():
                path = "/" + m.name.removeprefix("./").rstrip("/")
                check(m.uid == 0 and m.gid == 0, f"layer {i}: {path} owned by {m.uid}:{m.gid}, expected 0:0")
                check(m.mtime == 0, f"layer {i}: {path} has mtime {m.mtime} (not reproducible)")
                rootfs[path] = (m, layer.extractfile(m).read() if m.isfile() else None)

    image_config = config.get("config") or {}
    for path in expect_files:
        if path not in rootfs:
            problems.append(f"rootfs: {path} is missing")
            continue
        member, data = rootfs[path]
        check(member.isfile() and member.mode & 0o111 == 0o111, f"rootfs: {path} is not an executable file")
        interp = elf_interpreter_present(data or b"")
        check(interp is False, f"rootfs: {path} is " + ("not an ELF executable" if interp is None else
                                                        "dynamically linked (has an ELF interpreter)"))
    tmp = rootfs.get("/tmp")
    check(tmp is not None and tmp[0].isdir() and tmp[0].mode & 0o1777 == 0o1777, "rootfs: /tmp is not a 1777 directory")

    user = image_config.get("User", "")
    if expect_user is not None:
        check(user == expect_user, f"config: User {user!r}, expected {expect_user!r}")
    if user:
        uid, _, gid = user.partition(":")
        passwd = (rootfs.get("/etc/passwd", (None, b""))[1] or b"").decode()
        group = (rootfs.get("/etc/group", (None, b""))[1] or b"").decode()
        check(any(line.split(":")[2:3] == [uid] for line in passwd.splitlines()), f"/etc/passwd has no uid {uid}")
        if gid:
            check(any(line.split(":")[2:3] == [gid] for line in group.splitlines()), f"/etc/group has no gid {gid}")
    if expect_entrypoint is not None:
        check(image_config.get("Entrypoint") == [expect_entrypoint],
              f"config: Entrypoint {image_config.get('Entrypoint')!r}, expected [{expect_entrypoint!r}]")
        check(expect_entrypoint in rootfs, f"rootfs: the entrypoint {expect_entrypoint} is missing")
    if expect_cmd is not None:
        check((image_config.get("Cmd") or []) == list(expect_cmd),
              f"config: Cmd {image_config.get('Cmd')!r}, expected {list(expect_cmd)!r}")

    if "manifest.json" in files:
        docker = json.loads(files["manifest.json"])
        check(isinstance(docker, list) and len(docker) == 1, "manifest.json: expected one image")
        if isinstance(docker, list) and docker:
            entry = docker[0]
            config_digest = manifest["config"]["digest"]
            check(entry.get("Config") == "blobs/sha256/" + config_digest.removeprefix("sha256:"),
                  f"manifest.json: Config {entry.get('Config')!r} is not the OCI config blob")
            layer_paths = ["blobs/sha256/" + d["digest"].removeprefix("sha256:") for d in layer_descriptors]
            check(entry.get("Layers") == layer_paths, f"manifest.json: Layers {entry.get('Layers')!r}")
            check(name in (entry.get("RepoTags") or []), f"manifest.json: RepoTags {entry.get('RepoTags')!r}")

    if problems:
        raise Problems(problems)
    return {
        "archive": archive,
        "name": name,
        "manifest_digest": top["digest"],
        "config_digest": manifest["config"]["digest"],
        "layers": [d["digest"] for d in layer_descriptors],
        "user": user,
        "entrypoint": image_config.get("Entrypoint"),
        "cmd": image_config.get("Cmd"),
        "files": len(rootfs),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive")
    parser.add_argument("--expect-name")
    parser.add_argument("--expect-manifest-digest")
    parser.add_argument("--expect-file", action="append", default=[])
    parser.add_argument("--expect-user", help="UID:GID, or '' for root (no User)")
    parser.add_argument("--expect-entrypoint")
    parser.add_argument("--expect-cmd", action="append")
    args = parser.parse_args(argv)
    try:
        summary = verify(args.archive, args.expect_name, args.expect_manifest_digest, args.expect_file,
                         args.expect_user, args.expect_entrypoint, args.expect_cmd)
    except (Problems, OSError, tarfile.TarError, ValueError, KeyError) as e:
        print(f"verify_archive: {args.archive}: FAILED", file=sys.stderr)
        for line in getattr(e, "problems", [repr(e)]):
            print(f"  - {line}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
