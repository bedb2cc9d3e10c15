#!/usr/bin/env bash
# Builds the `ferry` image from the repository's Dockerfile with buildah (rootful) and writes it as an OCI archive;
# prints the archive's path on stdout, its sizes on stderr. No registry is needed: the Dockerfile's two bases are made
# here, once, from Debian's archive (kept in buildah's storage):
#   localhost/debian:trixie-slim  mmdebstrap's minbase of trixie, slimmed as Docker Hub's debian:trixie-slim is
#                                 (no docs, man pages or locales; apt keeps no downloaded packages or indexes)
#   localhost/rust:1-trixie       that base with gcc and Rust stable from rustup (hack/rust.Containerfile)
#
#   hack/image.sh                 builds ferry from this tree in the Dockerfile's build stage (release)
#   hack/image.sh --binary PATH   takes a ferry built by the same cargo command instead (--build-context binary=...);
#                                 no Rust base is made. The lab's real node builds its image this way.
#   --name NAME                   the image's name (ferry:0.1.0, what deploy/ runs); the archive names it as the
#                                 kubelet resolves it (docker.io/library/ferry:0.1.0), for `ctr image import`
#
# The archive is cached by what goes into it (the Dockerfile, the bases' image IDs, and the binary or the source
# tree) in ${FERRY_IMAGE_CACHE:-~/.cache/ferry/images}: a second run with nothing changed builds nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${FERRY_IMAGE_CACHE:-$HOME/.cache/ferry/images}
name=ferry:0.1.0
binary=""

# The reference the kubelet resolves a name to, as containerd stores it (crates/lab/src/real_node/oci.rs,
# full_reference): Docker Hub's library/ for a bare name, :latest when no tag is given.
reference_of() {
  local ref=$1
  case ${ref%%/*} in
    "$ref") ref=docker.io/library/$ref ;;
    *.*|*:*|localhost) ;;
    *) ref=docker.io/$ref ;;
  esac
  case ${ref##*/} in *:*) ;; *) ref=$ref:latest ;; esac
  echo "$ref"
}

while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=$(realpath "$2"); shift 2 ;;
    --name) name=$2; shift 2 ;;
    --reference) reference_of "$2"; exit 0 ;;
    *) echo "usage: hack/image.sh [--binary PATH] [--name NAME] | --reference NAME" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "hack/image.sh runs buildah as root (as the real node does)" >&2; exit 1; }
for tool in buildah mmdebstrap jq; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install $tool (hack/setup.sh --node)" >&2; exit 1; }
done
[ -z "$binary" ] || [ -x "$binary" ] || { echo "$binary is not an executable" >&2; exit 1; }

SLIM=localhost/debian:trixie-slim
RUST=localhost/rust:1-trixie
MIRROR=http://deb.debian.org
mkdir -p "$cache"
# One build at a time: two would race for the bases and the archive.
exec 9>"$cache/.image.lock"
flock 9
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

image_id() { buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null; }
mb() { echo "$(( ($1 + 500000) / 1000000 )) MB"; }

# The base: trixie's required packages and apt (what debian:trixie-slim holds), from Debian's archive with the
# suite's updates and security sources, the paths Docker Hub's slim images exclude excluded for every later install
# too (dpkg keeps --dpkgopt in /etc/dpkg/dpkg.cfg.d/99mmdebstrap), and the apt settings of Docker's Debian images.
make_slim() {
  echo "making $SLIM from Debian's archive (mmdebstrap, under a minute, once)" >&2
  local container mount
  container=$(buildah from scratch)
  mount=$(buildah mount "$container")
  local apt_clean='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; }; APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; }; Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";'
  if ! mmdebstrap --mode=root --variant=minbase --format=tar --quiet --skip=output/dev \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --aptopt='Acquire::Languages "none"' \
    --customize-hook="printf '%s\n' '$apt_clean' > \"\$1/etc/apt/apt.conf.d/docker-clean\"" \
    --customize-hook='rm -f "$1"/var/cache/apt/*.bin "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old' \
    trixie - "deb $MIRROR/debian trixie main" "deb $MIRROR/debian trixie-updates main" \
    "deb $MIRROR/debian-security trixie-security main" |
    tar -C "$mount" -xp --numeric-owner --xattrs --xattrs-include='*'; then
    buildah rm "$container" >/dev/null
    echo "mmdebstrap could not make $SLIM" >&2
    exit 1
  fi
  buildah umount "$container" >/dev/null
  buildah config --cmd bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.opencontainers.image.description="Debian trixie minbase from $MIRROR/debian (hack/image.sh)" \
    "$container"
  buildah commit --quiet --rm "$container" "$SLIM" >/dev/null
}

# The builder: trusts what this machine trusts (its CA bundle, with the CA of a TLS-inspecting proxy if it has one),
# so that rustup and cargo download where the machine does. Only the builder: the image users run is not built on it.
make_rust() {
  echo "making $RUST: gcc and Rust stable from rustup (static.rust-lang.org), once" >&2
  mkdir "$tmp/rust"
  cp /etc/ssl/certs/ca-certificates.crt "$tmp/rust/machine-ca-certificates.crt"
  buildah build --quiet --pull=never --network=host --layers --build-arg BASE="$SLIM" -t "$RUST" \
    -f "$root/hack/rust.Containerfile" "$tmp/rust" >&2
}

[ -n "$(image_id "$SLIM")" ] || make_slim
[ -n "$binary" ] || [ -n "$(image_id "$RUST")" ] || make_rust

# The cache key: the Dockerfile, the bases, and the binary or every file of the build context.
key=$( {
  echo "$name"
  cat "$root/Dockerfile" "$root/.dockerignore"
  image_id "$SLIM"
  if [ -n "$binary" ]; then
    sha256sum <"$binary"
  else
    image_id "$RUST"
    (cd "$root" && git ls-files -z --cached --others --exclude-standard | LC_ALL=C sort -z |
      while IFS= read -r -d '' f; do [ ! -f "$f" ] || { printf '%s\n' "$f"; sha256sum <"$f"; }; done)
  fi
} | sha256sum | cut -c1-16)
archive=$cache/ferry-image-$key.oci.tar

reference=$(reference_of "$name")

if [ -f "$archive" ] && [ -f "$archive.size" ]; then
  echo "image $name (cached, key $key): $(mb "$(cat "$archive.size")") uncompressed, archive $(mb "$(stat -c %s "$archive")")" >&2
  echo "$archive"
  exit 0
fi

started=$(date +%s)
previous=$(image_id "localhost/$name" || true)
args=(--quiet --pull=never --network=host --layers --build-arg BASE="$SLIM" --build-arg BUILDER="$RUST"
  -t "localhost/$name" -f "$root/Dockerfile")
if [ -n "$binary" ]; then
  mkdir "$tmp/binary"
  cp "$binary" "$tmp/binary/ferry"
  args+=(--build-context "binary=$tmp/binary")
  echo "building $name with buildah from the Dockerfile, ferry from $binary" >&2
else
  echo "building $name with buildah from the Dockerfile, ferry built from this tree (a release build)" >&2
fi
buildah build "${args[@]}" "$root" >/dev/null
built=$(date +%s)
# The image before this one (a former binary) is dropped from buildah's storage; the layers it shares stay.
current=$(image_id "localhost/$name")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  buildah rmi "$previous" >/dev/null 2>&1 || true
fi

# Uncompressed: the layers as buildah stores them; the archive's layers are gzip-compressed.
size=$(buildah inspect --type image --format '{{.Manifest}}' "localhost/$name" | jq '[.layers[].size] | add')
# One archive is kept: the one just built (with its size, and no partial one left by an interrupted run).
rm -f "$cache"/ferry-image-*.oci.tar*
buildah push --quiet "localhost/$name" "oci-archive:$archive.partial:$reference"
mv "$archive.partial" "$archive"
echo "$size" >"$archive.size"
echo "image $name built by buildah in $((built - started)) s (archive written in $(( $(date +%s) - built )) s): $(mb "$size") uncompressed, archive $(mb "$(stat -c %s "$archive")")" >&2
echo "$archive"
