#!/usr/bin/env bash
# Installs the Debian packages the local provider needs, only those that are missing.
# The package scripts must not start a system-wide containerd: where no policy-rc.d forbids starting
# services, one is put in place for the duration of the install.
set -euo pipefail
PKGS=(containerd runc containernetworking-plugins iptables conntrack busybox-static openssl iproute2 util-linux
      curl python3 jq chrony)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-debs: installing ${missing[*]}" >&2
policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; own_policy=1
fi
trap '[ -z "$own_policy" ] || rm -f "$policy"' EXIT
apt_get() { apt-get -o DPkg::Lock::Timeout=300 -y "$@"; }
# A fresh machine has no package lists yet; an old list may point at versions no longer served.
apt_get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt_get install -qq --no-install-recommends "${missing[@]}" >/dev/null
