#!/usr/bin/env bash
# Installs what Ferry's lab and tests need on a fresh Debian machine, then builds the Go tools.
# Idempotent: a machine that has everything spends a second here. Prints the tools' bin directory.
# With --node: also what a real node needs (`ferry lab up --node real`: runc, ip, a C compiler for the pause
# process, buildah for the `ferry` image: hack/image.sh), and prints the real node's tools' bin directory instead
# (hack/tools.sh --node).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# Debian packages: binary (or file) -> package. The second and third lines are what the lab's Debian guests are built and
# booted with (crates/lab/guest/debian12.sh; OVMF for the EFI guest with Secure Boot). The last two lines are guest
# adaptation: virt-v2v, nbdkit for its input, guestfish (which keeps a Linux guest's interface names), and a kernel
# for libguestfs's appliance (supermin builds it from /boot); then what the phony Windows guests are built and read
# back with (crates/lab/src/windows): guestfish again, hivex's shell and hivexregedit, and xorriso for the fake
# virtio-win ISO. Chromium, headless, is the browser `ferry ui`'s test reads the dashboard with.
declare -A need=(
  [qemu-img]=qemu-utils [qemu-system-x86_64]=qemu-system-x86 [bwrap]=bubblewrap [flock]=util-linux [curl]=curl
  [mmdebstrap]=mmdebstrap [/usr/sbin/mkfs.ext4]=e2fsprogs [/usr/sbin/mkfs.vfat]=dosfstools [/usr/sbin/sfdisk]=fdisk
  [mcopy]=mtools [openssl]=openssl [/usr/share/OVMF/OVMF_CODE_4M.secboot.fd]=ovmf
  [/usr/sbin/qemu-ga]=qemu-guest-agent
  [jq]=jq [chromium]=chromium
  [virt-v2v-in-place]=virt-v2v [nbdkit]=nbdkit
  [guestfish]=guestfish [hivexsh]=libhivex-bin [hivexregedit]=libwin-hivex-perl [xorriso]=xorriso
)
if [ "${1:-}" = --node ]; then
  need+=([/usr/sbin/runc]=runc [/usr/sbin/ip]=iproute2 [gcc]=gcc [/usr/include/stdio.h]=libc6-dev [buildah]=buildah)
fi
missing=()
for bin in "${!need[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || [ -e "$bin" ] || missing+=("${need[$bin]}")
done
compgen -G "/boot/vmlinuz-*" >/dev/null || missing+=(linux-image-amd64)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}" >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

for tool in go cargo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool is required (Go 1.26 and Rust stable)" >&2; exit 1; }
done

if [ "${1:-}" = --node ]; then
  bash "$root/hack/tools.sh" >/dev/null
  exec bash "$root/hack/tools.sh" --node
fi
bash "$root/hack/tools.sh"
