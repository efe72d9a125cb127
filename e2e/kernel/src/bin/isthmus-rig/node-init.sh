#!/bin/sh
# PID 1 of an e2e cluster node's first stage (the initramfs `isthmus-rig node-initramfs` writes, node.rs):
# busybox mounts this machine's / read-only, lays a tmpfs over it (overlay), shares the node's io directory
# writable, and hands over to the node's init (e2e/cluster/lib/vm-guest.sh) as PID 1. Its environment comes
# from the kernel's command line (`isthmus-rig node-boot`).
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules/load.order); do insmod "/modules/$m" || echo "ISTHMUS-VM insmod $m failed"; done
if [ "$ISTHMUS_VM_KERNEL" = sid ]; then
  mount -t hostfs -o / -r none /host
else
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose host /host
fi
mount -t tmpfs -o mode=0755 upper /upper && mkdir -p /upper/up /upper/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/upper/up,workdir=/upper/work /new || { echo "ISTHMUS-VM overlay failed"; poweroff -f; }
mkdir -p "/new$ISTHMUS_VM_IO"
if [ "$ISTHMUS_VM_KERNEL" = sid ]; then
  mount -t hostfs -o "$ISTHMUS_VM_IO" none "/new$ISTHMUS_VM_IO"
else
  mount -t 9p -o trans=virtio,version=9p2000.L,cache=none io "/new$ISTHMUS_VM_IO"
fi
umount /proc /sys /dev 2>/dev/null
exec switch_root /new /bin/bash "$ISTHMUS_VM_GUEST"
