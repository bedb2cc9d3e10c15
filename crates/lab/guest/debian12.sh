#!/usr/bin/env bash
# Ferry's lab guests: Debian 12 disk images shaped like VMware VMs, built from Debian's packages only.
#
#   debian12.sh check-tools   prints "binary (package)" for every host tool that is missing, one a line
#   debian12.sh build OUT     writes OUT/{bios,efi,static,nm}.raw, OUT/data.raw and OUT/manifest.json
#
# Everything the images hold is decided in this file: ferry-lab hashes it to name the cache entry, so editing it
# rebuilds the images. Needs root (mmdebstrap's root mode chroots into the tree; no loop devices, no mounts of ours:
# file systems are made from directories with mkfs.ext4 -d and mtools, and the BIOS boot code is written with dd).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin LC_ALL=C.UTF-8

SUITE=bookworm
MIRROR=${FERRY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${FERRY_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
DISK_MIB=1024 # every lab test copies the root disk through the whole data path: keep it small
ESP_MIB=64    # FAT32 needs 65525 clusters at least: 64 MiB of 512-byte clusters
DATA_MIB=32
PAYLOAD_BYTES=$((4 << 20))
# Kernel modules the initramfs holds: VMware's storage (PVSCSI, LSI Logic SPI and SAS), its NIC, the SATA controller
# of a VMware CD-ROM, disks, ext4. Nothing virtio: an unadapted boot on KubeVirt's devices must fail as it would.
INITRAMFS_MODULES="vmw_pvscsi mptspi mptsas vmxnet3 ahci sd_mod sr_mod ext4 crc32c_generic"
PACKAGES="linux-image-amd64,initramfs-tools,systemd,systemd-sysv,udev,dbus,iproute2,open-vm-tools,qemu-guest-agent"
PACKAGES+=",grub-pc-bin,zstd,ifupdown,network-manager,iputils-ping"
# The static variant: the address a Debian server installed on VMware gives its first vmxnet3 NIC, ens192.
STATIC_NIC=ens192
STATIC_ADDRESS=192.168.50.10
STATIC_PREFIX=24
STATIC_GATEWAY=192.168.50.1
# The NetworkManager variant (RHEL 9's way): keyfiles with static addresses for its two vmxnet3 NICs, ens192 with
# the default gateway and ens224 on a network of its own.
NM_NIC=ens192
NM_ADDRESS=192.168.50.11
NM_SECOND_NIC=ens224
NM_SECOND_ADDRESS=192.168.60.11
EFI_PACKAGES="shim-signed shim-helpers-amd64-signed grub-efi-amd64-signed"
TOOLS="mmdebstrap:mmdebstrap mkfs.ext4:e2fsprogs mkfs.vfat:dosfstools mmd:mtools mcopy:mtools sfdisk:fdisk"
TOOLS+=" openssl:openssl sha256sum:coreutils chroot:coreutils"

log() { echo "guest-image: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

check_tools() {
  local t
  for t in $TOOLS; do command -v "${t%%:*}" >/dev/null 2>&1 || echo "${t%%:*} (${t#*:})"; done
}

uuid() { cat /proc/sys/kernel/random/uuid; }

# The hook mmdebstrap runs inside its tree before cleaning it: configuration shared by both variants.
customize() {
  local root=$1
  log "configuring the tree"
  mkdir -p "$root/data"

  # DHCP on every Ethernet NIC, whatever the name (ens192 on VMware, enp1s0 on KubeVirt).
  cat >"$root/etc/systemd/network/80-ferry-ethernet.network" <<'EOF'
[Match]
Type=ether

[Network]
DHCP=yes
EOF
  mkdir -p "$root/etc/systemd/system/systemd-networkd-wait-online.service.d"
  # Bounded: a guest without network still reaches multi-user and reports.
  cat >"$root/etc/systemd/system/systemd-networkd-wait-online.service.d/ferry.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=30
EOF
  chroot "$root" systemctl enable systemd-networkd.service
  # ifupdown and NetworkManager serve the static and nm variants only (root_fs turns them on there).
  chroot "$root" systemctl disable networking.service ifupdown-wait-online.service
  chroot "$root" systemctl disable NetworkManager.service NetworkManager-wait-online.service
  printf 'auto lo\niface lo inet loopback\n\nsource /etc/network/interfaces.d/*\n' >"$root/etc/network/interfaces"

  # The line the lab waits for.
  cat >"$root/usr/local/sbin/ferry-guest-ready" <<'EOF'
#!/bin/sh
# Prints one line on the serial console saying what booted, with which devices and which data.
nic=""
i=0
while [ $i -lt 15 ]; do
  nic=$(ip -4 route show default 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')
  [ -n "$nic" ] && break
  sleep 1
  i=$((i + 1))
done
if [ -z "$nic" ]; then
  for dev in /sys/class/net/*; do
    [ -e "$dev/device" ] && [ "$(cat "$dev/type")" = 1 ] && { nic=${dev##*/}; break; }
  done
fi
mac=none
ip=none
if [ -n "$nic" ]; then
  mac=$(cat "/sys/class/net/$nic/address")
  ip=$(ip -4 -o addr show dev "$nic" | awk '{ split($4, a, "/"); print a[1]; exit }')
  [ -n "$ip" ] || ip=none
fi
# Whether the default gateway answers: an address is only meaningful on a network where it is routed.
gw=none
router=$(ip -4 route show default 2>/dev/null | awk '{ print $3; exit }')
if [ -n "$router" ]; then
  gw=unreachable
  i=0
  while [ $i -lt 5 ]; do
    ping -n -q -c 1 -W 2 "$router" >/dev/null 2>&1 && { gw=reachable; break; }
    i=$((i + 1))
  done
fi
sha=missing
[ -f /data/payload.bin ] && sha=$(sha256sum /data/payload.bin | cut -d' ' -f1)
# A line of its own, even after the login prompt that serial-getty may have printed just before.
printf '\r\nFERRY-GUEST-READY %s kernel=%s root=%s mac=%s ip=%s gw=%s data-sha256=%s\r\n' \
  "$(hostname)" "$(uname -r)" "$(findmnt -n -o SOURCE /)" "$mac" "$ip" "$gw" "$sha" >/dev/ttyS0
EOF
  chmod 755 "$root/usr/local/sbin/ferry-guest-ready"
  cat >"$root/etc/systemd/system/ferry-guest-ready.service" <<'EOF'
[Unit]
Description=Report to Ferry's lab that this guest reached multi-user
Wants=network-online.target
After=network-online.target multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/ferry-guest-ready

[Install]
WantedBy=multi-user.target
EOF
  chroot "$root" systemctl enable ferry-guest-ready.service

  # qemu-guest-agent: Debian's unit is bound to the virtio port's device and pulled in by its udev rule, so it starts
  # exactly when KubeVirt's channel org.qemu.guest_agent.0 exists. Fail if a Debian update ever changes that.
  grep -q 'BindsTo=dev-virtio\\x2dports-org.qemu.guest_agent.0.device' "$root/lib/systemd/system/qemu-guest-agent.service" ||
    die "qemu-guest-agent.service is no longer bound to its virtio port"
  grep -rqs 'SYSTEMD_WANTS.*qemu-guest-agent.service' "$root/lib/udev/rules.d/" ||
    die "no udev rule starts qemu-guest-agent when its port appears"

  # The initramfs of a VM installed on VMware: its drivers only.
  echo "MODULES=list" >"$root/etc/initramfs-tools/conf.d/ferry-vmware"
  echo "RESUME=none" >>"$root/etc/initramfs-tools/conf.d/ferry-vmware"
  printf '%s\n' "# VMware hardware only (Ferry's lab guest)" $INITRAMFS_MODULES >"$root/etc/initramfs-tools/modules"
  chroot "$root" update-initramfs -u -k all
  local kver listing m
  kver=$(basename "$(ls -d "$root"/lib/modules/*)")
  listing=$(chroot "$root" lsinitramfs "/boot/initrd.img-$kver")
  if grep -E '/virtio[^/]*\.ko' <<<"$listing"; then
    die "the initramfs holds virtio modules (above)"
  fi
  for m in vmw_pvscsi mptspi mptsas vmxnet3 ahci sd_mod ext4; do
    grep -q "/$m\.ko" <<<"$listing" || die "the initramfs lacks $m"
  done
  log "initramfs: $(grep -c '\.ko' <<<"$listing") modules, none virtio"

  # Each boot makes its own machine id (and with it its DHCP client id).
  : >"$root/etc/machine-id"
  rm -f "$root/var/lib/dbus/machine-id"

  # The signed EFI boot chain is copied to the ESP, not installed (its postinst wants a mounted ESP). Downloaded
  # while the tree has package lists, kept beside the tree (mmdebstrap empties its /tmp).
  mkdir -p "$root/tmp/efi-debs"
  # shellcheck disable=SC2086
  chroot "$root" sh -c "cd /tmp/efi-debs && apt-get download -q $EFI_PACKAGES" >&2
  mv "$root/tmp/efi-debs" "$root/../efi-debs"
}

# grub.cfg on the root file system, as update-grub would write it for one kernel (timeout 0, serial console).
# No rootdelay=: initramfs-tools already gives up on a missing root after max(30, rootdelay) seconds, and rootdelay=
# would also make every boot sleep that long before mounting.
grub_cfg() {
  local uuid=$1 kver=$2
  cat <<EOF
set default=0
set timeout=0
if [ "\$grub_platform" = pc ]; then
  serial --unit=0 --speed=115200
  terminal_input console serial
  terminal_output console serial
fi
menuentry 'Debian GNU/Linux 12' {
  search --no-floppy --fs-uuid --set=root $uuid
  linux /boot/vmlinuz-$kver root=UUID=$uuid ro console=tty0 console=ttyS0,115200
  initrd /boot/initrd.img-$kver
}
EOF
}

# The variant's network: `dhcp` (systemd-networkd, DHCP on any Ethernet NIC whatever its name), `static` (ifupdown
# with a static address on ens192 as Debian's installer writes it), or `nm` (NetworkManager keyfiles with static
# addresses on ens192 and ens224). The static configurations name their interfaces, so they apply only while the
# NICs keep those names.
network_config() {
  local tree=$1 kind=$2 networkd=80-ferry-ethernet.network
  local connections=$tree/etc/NetworkManager/system-connections
  # Back to DHCP on any NIC first; then the variant's own.
  chroot "$tree" systemctl disable -q networking.service ifupdown-wait-online.service \
    NetworkManager.service NetworkManager-wait-online.service
  chroot "$tree" systemctl enable -q systemd-networkd.service
  [ -f "$tree/etc/systemd/network/$networkd" ] ||
    mv "$tree/etc/systemd/network/$networkd.off" "$tree/etc/systemd/network/$networkd"
  rm -f "$tree/etc/network/interfaces.d/$STATIC_NIC" "$connections"/*.nmconnection
  [ "$kind" = dhcp ] && return
  chroot "$tree" systemctl disable -q systemd-networkd.service systemd-networkd-wait-online.service
  mv "$tree/etc/systemd/network/$networkd" "$tree/etc/systemd/network/$networkd.off"
  case $kind in
  static)
    chroot "$tree" systemctl enable -q networking.service ifupdown-wait-online.service
    cat >"$tree/etc/network/interfaces.d/$STATIC_NIC" <<IFACE
# The primary network interface
allow-hotplug $STATIC_NIC
iface $STATIC_NIC inet static
	address $STATIC_ADDRESS/$STATIC_PREFIX
	gateway $STATIC_GATEWAY
IFACE
    ;;
  nm)
    chroot "$tree" systemctl enable -q NetworkManager.service NetworkManager-wait-online.service
    nm_keyfile "$NM_NIC" "$NM_ADDRESS/$STATIC_PREFIX,$STATIC_GATEWAY" >"$connections/$NM_NIC.nmconnection"
    nm_keyfile "$NM_SECOND_NIC" "$NM_SECOND_ADDRESS/$STATIC_PREFIX" >"$connections/$NM_SECOND_NIC.nmconnection"
    # NetworkManager ignores a keyfile anyone but root could read.
    chmod 600 "$connections"/*.nmconnection
    ;;
  *) die "unknown network kind $kind" ;;
  esac
}

# A keyfile as nmcli writes one for `con add type ethernet ifname NAME ipv4.method manual ipv4.addresses ADDRESS`.
nm_keyfile() {
  local name=$1 address=$2
  cat <<KEYFILE
[connection]
id=$name
uuid=$(uuid)
type=ethernet
interface-name=$name

[ethernet]

[ipv4]
address1=$address
method=manual

[ipv6]
addr-gen-mode=default
method=disabled

[proxy]
KEYFILE
}

# Writes the per-variant files into the shared tree, then makes the root file system image from it.
root_fs() {
  local tree=$1 hostname=$2 uuid=$3 data_uuid=$4 esp_uuid=$5 kver=$6 image=$7 mib=$8 network=${9:-dhcp}
  network_config "$tree" "$network"
  echo "$hostname" >"$tree/etc/hostname"
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$hostname" >"$tree/etc/hosts"
  {
    echo "UUID=$uuid / ext4 errors=remount-ro 0 1"
    # No nofail: a missing data disk must show.
    echo "UUID=$data_uuid /data ext4 defaults 0 2"
    [ -z "$esp_uuid" ] || echo "UUID=$esp_uuid /boot/efi vfat umask=0077 0 1"
  } >"$tree/etc/fstab"
  mkdir -p "$tree/boot/grub"
  if [ -n "$esp_uuid" ]; then mkdir -p "$tree/boot/efi"; else rm -rf "$tree/boot/efi"; fi
  grub_cfg "$uuid" "$kver" >"$tree/boot/grub/grub.cfg"
  mkfs.ext4 -q -F -L root -U "$uuid" -d "$tree" "$image" "${mib}M"
}

# BIOS: MBR, root on partition 1 from 1 MiB; GRUB's boot.img in the MBR and its core.img in the gap before it.
bios_disk() {
  local tree=$1 hostname=$2 bios_uuid=$3 data_uuid=$4 kver=$5 disk=$6 network=$7
  log "$hostname: root file system"
  root_fs "$tree" "$hostname" "$bios_uuid" "$data_uuid" "" "$kver" "$work/root.ext4" $((DISK_MIB - 1)) "$network"
  rm -f "$disk" && truncate -s "${DISK_MIB}M" "$disk"
  echo 'label: dos
start=2048, type=83, bootable' | sfdisk -q "$disk"
  dd if="$work/root.ext4" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
  cat >"$tree/tmp/early.cfg" <<EOF
search --no-floppy --fs-uuid --set=root $bios_uuid
set prefix=(\$root)/boot/grub
EOF
  chroot "$tree" grub-mkimage -O i386-pc -o /tmp/core.img -c /tmp/early.cfg -p /boot/grub \
    biosdisk part_msdos ext2 search search_fs_uuid normal linux configfile serial terminal test echo gzio
  local core_sectors=$((($(stat -c %s "$tree/tmp/core.img") + 511) / 512))
  [ "$core_sectors" -lt 2047 ] || die "GRUB's core.img ($core_sectors sectors) does not fit before partition 1"
  # boot.img loads core.img from sector 1, whose first sector loads the rest: the defaults grub-mkimage writes.
  dd if="$tree/usr/lib/grub/i386-pc/boot.img" of="$disk" bs=440 count=1 conv=notrunc status=none
  dd if="$tree/tmp/core.img" of="$disk" bs=512 seek=1 conv=notrunc status=none
  rm -f "$tree/tmp/core.img" "$tree/tmp/early.cfg"
}

# EFI: GPT, root on partition 1, ESP (FAT32) on partition 2 with Debian's signed shim and GRUB, both in
# \EFI\debian (as grub-install puts them) and at the removable path \EFI\BOOT that firmware with empty NVRAM boots.
# Sets made_esp_uuid.
efi_disk() {
  local tree=$1 hostname=$2 efi_uuid=$3 data_uuid=$4 kver=$5 disk=$6 network=$7 esp_id esp_uuid
  local efi=$work/efi
  esp_id=$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
  esp_uuid=$(echo "${esp_id:0:4}-${esp_id:4:4}" | tr a-f A-F)
  log "$hostname: root file system and ESP"
  local root_mib=$((DISK_MIB - ESP_MIB - 2))
  root_fs "$tree" "$hostname" "$efi_uuid" "$data_uuid" "$esp_uuid" "$kver" "$work/root.ext4" "$root_mib" "$network"
  rm -f "$disk" && truncate -s "${DISK_MIB}M" "$disk"
  printf 'label: gpt\nstart=1MiB, size=%sMiB, type=L\nstart=%sMiB, size=%sMiB, type=U\n' \
    "$root_mib" $((root_mib + 1)) "$ESP_MIB" | sfdisk -q "$disk"
  dd if="$work/root.ext4" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
  local esp=$work/esp.fat
  mkfs.vfat -F 32 -n EFI -i "$esp_id" -C "$esp" $((ESP_MIB * 1024)) >/dev/null
  printf 'search.fs_uuid %s root\nset prefix=($root)/boot/grub\nconfigfile $prefix/grub.cfg\n' "$efi_uuid" >"$work/stub.cfg"
  printf 'shimx64.efi,debian,,This is the boot entry for debian\n' | iconv -t UTF-16 >"$work/BOOTX64.CSV"
  mmd -i "$esp" ::/EFI ::/EFI/BOOT ::/EFI/debian
  local dir
  for dir in BOOT debian; do
    mcopy -i "$esp" "$efi/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed" "::/EFI/$dir/grubx64.efi"
    mcopy -i "$esp" "$efi/usr/lib/shim/mmx64.efi.signed" "::/EFI/$dir/mmx64.efi"
    mcopy -i "$esp" "$work/stub.cfg" "::/EFI/$dir/grub.cfg"
  done
  mcopy -i "$esp" "$efi/usr/lib/shim/shimx64.efi.signed" ::/EFI/BOOT/BOOTX64.EFI
  mcopy -i "$esp" "$efi/usr/lib/shim/shimx64.efi.signed" ::/EFI/debian/shimx64.efi
  # The fallback loader only in \EFI\debian: in \EFI\BOOT it would write boot entries and reset the VM first.
  mcopy -i "$esp" "$efi/usr/lib/shim/fbx64.efi.signed" ::/EFI/debian/fbx64.efi
  mcopy -i "$esp" "$work/BOOTX64.CSV" ::/EFI/debian/BOOTX64.CSV
  dd if="$esp" of="$disk" bs=1M seek=$((root_mib + 1)) conv=notrunc,sparse status=none
  rm -f "$esp"
  made_esp_uuid=$esp_uuid
}

build() {
  local out=$1
  [ "$(id -u)" = 0 ] || die "building the guest images needs root (mmdebstrap chroots into the tree)"
  local missing
  missing=$(check_tools)
  [ -z "$missing" ] || die "missing tools: $(echo "$missing" | tr '\n' ' ')(hack/setup.sh installs them)"
  mkdir -p "$out"
  work=$(mktemp -d "$out/work.XXXXXX")
  trap 'cleanup' EXIT
  local tree=$work/tree start=$SECONDS
  local self
  self=$(readlink -f "$0")

  log "mmdebstrap $SUITE from $MIRROR"
  mmdebstrap --variant=minbase --mode=root --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --customize-hook="bash '$self' customize \"\$1\"" \
    "$SUITE" "$tree" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main"
  local kver
  kver=$(basename "$(ls -d "$tree"/lib/modules/*)")
  log "tree ready in $((SECONDS - start))s: kernel $kver, $(du -sm "$tree" | cut -f1) MiB"

  # Which virtio drivers the kernel has built in (then no initramfs could keep them out).
  local builtin
  builtin=$(grep -E '^CONFIG_(VIRTIO|VIRTIO_PCI|VIRTIO_BLK|SCSI_VIRTIO|VIRTIO_NET)=y' "$tree/boot/config-$kver" |
    cut -d= -f1 | tr '\n' ' ' || true)
  [ -z "$builtin" ] || log "built into the kernel: $builtin"

  local efi=$work/efi deb
  mkdir -p "$efi"
  for deb in "$work"/efi-debs/*.deb; do dpkg-deb -x "$deb" "$efi"; done

  # The data disk: a whole-disk ext4 holding a payload of known bytes (AES-CTR of zeros under a fixed key).
  local data_uuid payload_sha
  data_uuid=$(uuid)
  mkdir -p "$work/data"
  head -c "$PAYLOAD_BYTES" /dev/zero |
    openssl enc -aes-128-ctr -nosalt -K 6665727279206c616220677565737421 -iv 00000000000000000000000000000000 >"$work/data/payload.bin"
  payload_sha=$(sha256sum "$work/data/payload.bin" | cut -d' ' -f1)
  mkfs.ext4 -q -F -L ferry-data -U "$data_uuid" -d "$work/data" "$out/data.raw" "${DATA_MIB}M"

  local bios_uuid=$(uuid) static_uuid=$(uuid)
  bios_disk "$tree" ferry-linux-bios "$bios_uuid" "$data_uuid" "$kver" "$out/bios.raw" dhcp

  local efi_uuid=$(uuid) nm_uuid=$(uuid) esp_uuid nm_esp_uuid
  efi_disk "$tree" ferry-linux-efi "$efi_uuid" "$data_uuid" "$kver" "$out/efi.raw" dhcp
  esp_uuid=$made_esp_uuid
  efi_disk "$tree" ferry-linux-nm "$nm_uuid" "$data_uuid" "$kver" "$out/nm.raw" nm
  nm_esp_uuid=$made_esp_uuid

  bios_disk "$tree" ferry-linux-static "$static_uuid" "$data_uuid" "$kver" "$out/static.raw" static

  cat >"$out/manifest.json" <<EOF
{
  "recipe_hash": "${FERRY_GUEST_RECIPE_HASH:-unknown}",
  "suite": "$SUITE",
  "kernel": "$kver",
  "virtio_built_in": "${builtin% }",
  "data": {"file": "data.raw", "size": $((DATA_MIB << 20)), "uuid": "$data_uuid", "payload": "payload.bin", "payload_sha256": "$payload_sha"},
  "variants": [
    {"name": "bios", "hostname": "ferry-linux-bios", "firmware": "bios", "file": "bios.raw", "size": $((DISK_MIB << 20)), "root_uuid": "$bios_uuid"},
    {"name": "efi", "hostname": "ferry-linux-efi", "firmware": "efi", "file": "efi.raw", "size": $((DISK_MIB << 20)), "root_uuid": "$efi_uuid", "esp_uuid": "$esp_uuid"},
    {"name": "static", "hostname": "ferry-linux-static", "firmware": "bios", "file": "static.raw", "size": $((DISK_MIB << 20)), "root_uuid": "$static_uuid",
     "networks": [{"interface": "$STATIC_NIC", "address": "$STATIC_ADDRESS", "prefix_length": $STATIC_PREFIX, "gateway": "$STATIC_GATEWAY"}]},
    {"name": "nm", "hostname": "ferry-linux-nm", "firmware": "efi", "file": "nm.raw", "size": $((DISK_MIB << 20)), "root_uuid": "$nm_uuid", "esp_uuid": "$nm_esp_uuid",
     "networks": [{"interface": "$NM_NIC", "address": "$NM_ADDRESS", "prefix_length": $STATIC_PREFIX, "gateway": "$STATIC_GATEWAY"},
                  {"interface": "$NM_SECOND_NIC", "address": "$NM_SECOND_ADDRESS", "prefix_length": $STATIC_PREFIX}]}
  ]
}
EOF
  log "built in $((SECONDS - start))s: $(du -sm --apparent-size "$out"/*.raw | tr '\n\t' '  ')(apparent MiB)"
}

# Removes the work directory, unmounting whatever mmdebstrap may have left mounted in it after a failure.
cleanup() {
  local status=$?
  if [ -n "${work:-}" ] && [ -d "$work" ]; then
    local m
    for m in $(awk -v w="$work" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r); do umount -l "$m" || true; done
    rm -rf "$work"
  fi
  exit "$status"
}

case "${1:-}" in
check-tools) check_tools ;;
customize) customize "$2" ;;
build) build "$2" ;;
*) die "usage: $0 check-tools | build OUT" ;;
esac
