# Sourced by e2e/images/build and e2e/images/arm64-test: how isthmus's static binaries are built per architecture,
# in one place, so that the images and the arm64 unit tests use the same target, toolchain and flags.
#
#   cross_setup ARCH      # amd64 | arm64: installs what is missing, sets TRIPLE and exports the build environment
#
# amd64: x86_64-unknown-linux-gnu with static glibc (-C target-feature=+crt-static; libc6-dev). Kept as it was
#        before arm64 existed so that warm caches stay warm and the amd64 images do not change.
# arm64: aarch64-unknown-linux-musl (static by default: Rust ships musl's crt objects and libc.a). ring compiles
#        C and assembly, so a C cross compiler with aarch64 headers is needed anyway: Debian's
#        gcc-aarch64-linux-gnu and libc6-dev-arm64-cross, and that gcc is also the linker.
# Needs root for apt-get where a package is missing (CI runners and this machine are root; elsewhere install them
# first: the check is a file test, so nothing runs when they are present).

apt_install() { # PACKAGE... ; waits for apt's lock instead of failing next to another install
  echo "cross: installing $* (apt-get)" >&2
  { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$@" ||
    { apt-get -o DPkg::Lock::Timeout=300 update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$@"; }; } >/dev/null ||
    { echo "cross: apt-get install $* failed" >&2; return 1; }
}

cross_setup() {
  case $1 in
    amd64)
      TRIPLE=x86_64-unknown-linux-gnu
      [ "$(uname -m)" = x86_64 ] || { echo "cross: amd64 is built on x86_64 hosts only (static glibc)" >&2; return 1; }
      # glibc's static libraries (libc6-dev) are what crt-static links against.
      [ -f /usr/lib/x86_64-linux-gnu/libc.a ] || apt_install libc6-dev || return 1
      # --target keeps RUSTFLAGS off build scripts and proc-macros, which must stay dynamic.
      export RUSTFLAGS='-C target-feature=+crt-static' ;;
    arm64)
      TRIPLE=aarch64-unknown-linux-musl
      [ "$(uname -m)" = x86_64 ] || { echo "cross: arm64 is cross-built on x86_64 hosts only" >&2; return 1; }
      rustup target list --installed | grep -qx "$TRIPLE" || rustup target add "$TRIPLE" >&2 || return 1
      local missing=()
      command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
      [ -f /usr/aarch64-linux-gnu/include/stdint.h ] || missing+=(libc6-dev-arm64-cross)
      [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}" || return 1
      # cc-rs would look for aarch64-linux-musl-gcc, which Debian does not package; ring's C needs only
      # freestanding headers, which the glibc cross headers provide.
      export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
      # No RUSTFLAGS: musl is static already, and the same (empty) flags as the arm64 tests share their builds.
      unset RUSTFLAGS ;;
    *) echo "cross: unknown architecture '$1' (expected amd64 or arm64)" >&2; return 1 ;;
  esac
}
