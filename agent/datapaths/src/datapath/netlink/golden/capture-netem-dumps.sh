#!/usr/bin/env bash
# Regenerates netem_dumps.txt: the kernel's RTM_NEWQDISC dump of netem qdiscs, from stock kernels (our hosts'
# kernels have no sch_netem). Boots the kernels the stock-kernel rig prepared (`e2e/kernel/rig fetch`, cached
# under ${CACHE:-~/.cache/isthmus}/kernel): Debian bookworm 6.1 under QEMU TCG and Debian sid's user-mode Linux.
# In each guest: a veth, a netem root qdisc per case, and `strace -e read=3 tc qdisc show` hex-dumps the reply.
# Needs root (UML/QEMU, strace on the host to copy into the guest), python3.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
K=${CACHE:-$HOME/.cache/isthmus}/kernel
W=$(mktemp -d /tmp/isth-netem-dumps.XXXXXX)
trap 'rm -rf "$W"' EXIT
bookworm=$(ls -d "$K"/bookworm-* | sort -V | tail -n1)
uml=$(ls -d "$K"/uml-* | sort -V | tail -n1)

R=$W/overlay; mkdir -p "$R"
for l in /usr/bin/strace $(ldd /usr/bin/strace | awk '/=>/ {print $3} /^[ \t]*\// {print $1}'); do install -D "$l" "$R$l"; done
cat > "$R/init" <<'EOF'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev 2>/dev/null; mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
for m in $(cat /modules/load.order); do insmod "/modules/$m" >/dev/null 2>&1; done
/usr/sbin/ip link add v0 type veth peer name v1
/usr/sbin/ip link set v0 up
cap() { name=$1; shift
  /usr/sbin/tc qdisc del dev v0 root >/dev/null 2>&1
  /usr/sbin/tc qdisc add dev v0 root handle 20: netem "$@" || echo "CAPTURE-FAILED $name"
  echo "CAPTURE-BEGIN $name"
  /usr/bin/strace -e trace=recvmsg -e read=3 /usr/sbin/tc qdisc show dev v0 2>&1 >/dev/null
  echo "CAPTURE-END $name"
}
cap netem_dump_all delay 50ms 5ms 25% loss 1% 30% duplicate 2% 10% corrupt 0.5% 5% reorder 25% 50% gap 5 limit 1000
cap netem_dump_gemodel loss gemodel 1% 10% 70% 0.1% limit 1000
cap netem_dump_limit limit 5000
cap netem_dump_rate rate 10mbit limit 1000
poweroff -f
EOF
chmod +x "$R/init"
initramfs() { # kernel dir, output: the cached base archive followed by the overlay
  cp "$1/base.cpio.gz" "$2"
  local pad=$(( (4 - $(stat -c %s "$2") % 4) % 4 ))
  [ "$pad" = 0 ] || head -c "$pad" /dev/zero >> "$2"
  (cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) >> "$2"
}
initramfs "$bookworm" "$W/bookworm.cpio"
initramfs "$uml" "$W/uml.cpio"
timeout -k 5 300 qemu-system-x86_64 -accel tcg -cpu max -m 512 -smp 1 -nodefaults -no-reboot -display none \
  -monitor none -serial stdio -kernel "$bookworm/vmlinux" -initrd "$W/bookworm.cpio" \
  -append "console=ttyS0 panic=-1 quiet loglevel=1" </dev/null >"$W/bookworm.console" 2>&1
mkdir -p "$W/umlrun" "$W/tmp"
(cd "$uml" && TMPDIR=$W/tmp timeout -k 5 120 env LD_LIBRARY_PATH="$uml" ./linux.uml mem=512M initrd="$W/uml.cpio" \
  con0=null,fd:1 con=null ssl=null quiet loglevel=1 uml_dir="$W/umlrun" umid=netem-dumps </dev/null >"$W/uml.console" 2>&1)

extract() { # console -> `name hex` per netem RTM_NEWQDISC in the received buffers
  python3 - "$1" <<'EOF'
import re, sys
name = None; bufs = []; cur = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"CAPTURE-BEGIN (\S+)", line)
    if m: name = m.group(1); bufs = []; continue
    if line.startswith("CAPTURE-END"):
        for b in bufs:
            off = 0
            while off + 16 <= len(b):
                ln = int.from_bytes(b[off:off+4], "little"); typ = int.from_bytes(b[off+4:off+6], "little")
                if ln < 16: break
                if typ == 36 and b"netem\x00" in b[off:off+ln]: print(name, b[off:off+ln].hex())
                off += (ln + 3) & ~3
        name = None; continue
    if name is None: continue
    if re.match(r" \* \d+ bytes in buffer", line): cur = bytearray(); bufs.append(cur); continue
    m = re.match(r" \| [0-9a-f]{5}  (.{48})", line)
    if m and cur is not None: cur.extend(bytes.fromhex(m.group(1).replace(" ", "")))
EOF
}
{
  echo "# RTM_NEWQDISC replies of 'tc qdisc show' for netem qdiscs, captured by capture-netem-dumps.sh"
  echo "# iproute2: $(tc -V) (host binary in the guest)"
  echo "# kernel $(cat "$bookworm/release") (Debian bookworm, QEMU TCG): prefix bookworm_"
  extract "$W/bookworm.console" | sed 's/^/bookworm_/'
  echo "# kernel $(cat "$uml/release") (Debian sid user-mode Linux): prefix uml_"
  extract "$W/uml.console" | sed 's/^/uml_/'
} > "$here/netem_dumps.txt.tmp"
[ "$(grep -vc '^#' "$here/netem_dumps.txt.tmp")" = 8 ] || { echo "expected 8 dumps" >&2; exit 1; }
mv "$here/netem_dumps.txt.tmp" "$here/netem_dumps.txt"
