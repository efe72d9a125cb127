#!/usr/bin/env python3
"""Checks an OCI image archive (an OCI image layout in a tar) the way a runtime would read it.

    verify_archive.py ARCHIVE [--expect-name REF] [--expect-manifest-digest sha256:...]
                      [--expect-platform linux/ARCH]...
                      [--expect-file PATH]... [--expect-user UID:GID | --expect-user ''] [--expect-entrypoint PATH]
                      [--expect-cmd ARG]...

An archive holds either one image (index.json -> manifest) or a multi-platform image (index.json -> image index
-> one manifest per platform, what a registry serves for `docker pull` on any architecture). Recomputes every
digest and size: each blob against its name, index.json -> [image index ->] manifest -> config and layers,
each layer's diff_id over its uncompressed tar; checks the media types containerd expects, the
io.containerd.image.name annotation, the Docker-style manifest.json beside a single image (for `docker load`),
that each manifest's platform is its config's and that its executables are built for that architecture, and in
the layers: expected files are static executables (no ELF interpreter), owners are root with time 0, /tmp is
world-writable and sticky, and a non-root user exists in /etc/passwd and /etc/group. Every expectation about
files, user, entrypoint and command holds for every platform. --expect-platform (default linux/amd64 alone) is
the exact set of platforms the archive must hold; --expect-manifest-digest is the digest of index.json's entry
(the image index's for a multi-platform archive: the digest a chart pins).
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
# ELF e_machine per OCI architecture: an arm64 manifest with an x86-64 binary would fail only on the node.
ELF_MACHINES = {"amd64": 62, "arm64": 183}


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


def elf_machine(data):
    """The ELF e_machine field, or None if DATA is no ELF file."""
    if len(data) < 20 or data[:4] != b"\x7fELF":
        return None
    return int.from_bytes(data[18:20], "little" if data[5] == 1 else "big")


def verify(archive, expect_name=None, expect_manifest_digest=None, expect_files=(), expect_user=None,
           expect_entrypoint=None, expect_cmd=None, expect_platforms=None):
    problems = []
    check = lambda ok, message: ok or problems.append(message)
    expect_platforms = sorted(expect_platforms or ["linux/amd64"])

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

    # A multi-platform image: index.json names an image index whose entries are one manifest per platform.
    multi = top.get("mediaType") == INDEX_TYPE
    if multi:
        image_index = json.loads(fetch(top, "index.json manifests[0]", (INDEX_TYPE,)))
        check(image_index.get("schemaVersion") == 2, "image index: schemaVersion is not 2")
        check(image_index.get("mediaType") == INDEX_TYPE, f"image index: mediaType {image_index.get('mediaType')!r}")
        entries = [(d, f"image index manifests[{i}]") for i, d in enumerate(image_index.get("manifests") or [])]
    else:
        entries = [(top, "index.json manifests[0]")]

    def platform_of(descriptor):
        platform = descriptor.get("platform") or {}
        return f"{platform.get('os')}/{platform.get('architecture')}"

    platforms = [platform_of(d) for d, _ in entries]
    check(sorted(platforms) == expect_platforms,
          f"platforms {sorted(platforms)} in the archive, expected {expect_platforms}")
    check(len(set(platforms)) == len(platforms), f"a platform is listed twice: {platforms}")

    images = {}
    for descriptor, what in entries:
        images[platform_of(descriptor)] = verify_image(
            descriptor, what, fetch, check, problems, expect_files, expect_user, expect_entrypoint, expect_cmd)

    if "manifest.json" in files:
        # Docker's format holds one image per platform-less entry: only a single image may carry it.
        check(not multi, "manifest.json: a multi-platform archive must not carry Docker's single-image manifest")
        docker = json.loads(files["manifest.json"])
        check(isinstance(docker, list) and len(docker) == 1, "manifest.json: expected one image")
        if not multi and isinstance(docker, list) and docker:
            entry = docker[0]
            only = next(iter(images.values()))
            check(entry.get("Config") == "blobs/sha256/" + only["config_digest"].removeprefix("sha256:"),
                  f"manifest.json: Config {entry.get('Config')!r} is not the OCI config blob")
            layer_paths = ["blobs/sha256/" + d.removeprefix("sha256:") for d in only["layers"]]
            check(entry.get("Layers") == layer_paths, f"manifest.json: Layers {entry.get('Layers')!r}")
            check(name in (entry.get("RepoTags") or []), f"manifest.json: RepoTags {entry.get('RepoTags')!r}")

    if problems:
        raise Problems(problems)
    if multi:
        return {"archive": archive, "name": name, "index_digest": top["digest"], "platforms": images}
    return {"archive": archive, "name": name, **next(iter(images.values()))}


def verify_image(descriptor, what, fetch, check, problems, expect_files, expect_user, expect_entrypoint,
                 expect_cmd):
    """Checks one platform's manifest, config and layers; returns its summary."""
    arch = (descriptor.get("platform") or {}).get("architecture")
    manifest = json.loads(fetch(descriptor, what, (MANIFEST_TYPE,)))
    check(manifest.get("schemaVersion") == 2, f"{arch} manifest: schemaVersion is not 2")
    check(manifest.get("mediaType") == MANIFEST_TYPE, f"{arch} manifest: mediaType {manifest.get('mediaType')!r}")
    config = json.loads(fetch(manifest["config"], f"{arch} manifest config", (CONFIG_TYPE,)))
    check(config.get("os") == "linux", f"{arch} config: os {config.get('os')!r}")
    check(config.get("architecture") == arch,
          f"{arch} config: architecture {config.get('architecture')!r}, the descriptor's platform says {arch!r}")

    layer_descriptors = manifest.get("layers") or []
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    check(len(layer_descriptors) == len(diff_ids),
          f"{arch}: {len(layer_descriptors)} layers in the manifest but {len(diff_ids)} diff_ids in the config")
    rootfs = {}
    for i, layer_descriptor in enumerate(layer_descriptors):
        blob = fetch(layer_descriptor, f"{arch} manifest layers[{i}]", LAYER_TYPES)
        tar_bytes = gzip.decompress(blob) if layer_descriptor.get("mediaType", "").endswith("+gzip") else blob
        if i < len(diff_ids):
            check(sha256(tar_bytes) == diff_ids[i],
                  f"{arch} layer {i}: diff_id {diff_ids[i]}, content {sha256(tar_bytes)}")
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as layer:
            for m in layer.getmembers():
                path = "/" + m.name.removeprefix("./").rstrip("/")
                check(m.uid == 0 and m.gid == 0, f"{arch} layer {i}: {path} owned by {m.uid}:{m.gid}, expected 0:0")
                check(m.mtime == 0, f"{arch} layer {i}: {path} has mtime {m.mtime} (not reproducible)")
                rootfs[path] = (m, layer.extractfile(m).read() if m.isfile() else None)

    image_config = config.get("config") or {}
    for path in expect_files:
        if path not in rootfs:
            problems.append(f"{arch} rootfs: {path} is missing")
            continue
        member, data = rootfs[path]
        check(member.isfile() and member.mode & 0o111 == 0o111, f"{arch} rootfs: {path} is not an executable file")
        interp = elf_interpreter_present(data or b"")
        check(interp is False, f"{arch} rootfs: {path} is " + ("not an ELF executable" if interp is None else
                                                               "dynamically linked (has an ELF interpreter)"))
        machine = elf_machine(data or b"")
        check(interp is None or machine == ELF_MACHINES.get(arch),
              f"{arch} rootfs: {path} is built for ELF machine {machine}, {arch} runs {ELF_MACHINES.get(arch)}")
    tmp = rootfs.get("/tmp")
    check(tmp is not None and tmp[0].isdir() and tmp[0].mode & 0o1777 == 0o1777,
          f"{arch} rootfs: /tmp is not a 1777 directory")

    user = image_config.get("User", "")
    if expect_user is not None:
        check(user == expect_user, f"{arch} config: User {user!r}, expected {expect_user!r}")
    if user:
        uid, _, gid = user.partition(":")
        passwd = (rootfs.get("/etc/passwd", (None, b""))[1] or b"").decode()
        group = (rootfs.get("/etc/group", (None, b""))[1] or b"").decode()
        check(any(line.split(":")[2:3] == [uid] for line in passwd.splitlines()), f"{arch}: /etc/passwd has no uid {uid}")
        if gid:
            check(any(line.split(":")[2:3] == [gid] for line in group.splitlines()),
                  f"{arch}: /etc/group has no gid {gid}")
    if expect_entrypoint is not None:
        check(image_config.get("Entrypoint") == [expect_entrypoint],
              f"{arch} config: Entrypoint {image_config.get('Entrypoint')!r}, expected [{expect_entrypoint!r}]")
        check(expect_entrypoint in rootfs, f"{arch} rootfs: the entrypoint {expect_entrypoint} is missing")
    if expect_cmd is not None:
        check((image_config.get("Cmd") or []) == list(expect_cmd),
              f"{arch} config: Cmd {image_config.get('Cmd')!r}, expected {list(expect_cmd)!r}")
    return {
        "manifest_digest": descriptor.get("digest"),
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
    parser.add_argument("--expect-platform", action="append", help="OS/ARCH; repeat for each (default linux/amd64)")
    args = parser.parse_args(argv)
    try:
        summary = verify(args.archive, args.expect_name, args.expect_manifest_digest, args.expect_file,
                         args.expect_user, args.expect_entrypoint, args.expect_cmd, args.expect_platform)
    except (Problems, OSError, tarfile.TarError, ValueError, KeyError) as e:
        print(f"verify_archive: {args.archive}: FAILED", file=sys.stderr)
        for line in getattr(e, "problems", [repr(e)]):
            print(f"  - {line}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
