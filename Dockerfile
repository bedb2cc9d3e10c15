# The `ferry` image: the controller (`ferry controller`) and the conversion, verification and adaptation Jobs
# (`ferry convert`, `ferry verify`, `ferry adapt`) run the same binary. Build: docker build -t REGISTRY/ferry:0.1.0 .
# (or buildah build, podman build). Without Docker Hub, name a mirror's copies of the two bases:
# --build-arg BUILDER=mirror.example/rust:1-trixie --build-arg BASE=mirror.example/debian:trixie-slim. Without any
# registry, hack/image.sh makes both bases from Debian's archive and builds this file with buildah; the lab's real
# node (`ferry lab up --node real`) runs the image it builds.
ARG BUILDER=rust:1-trixie
ARG BASE=debian:trixie-slim
FROM ${BUILDER} AS build
WORKDIR /src
COPY . .
# Without the default `lab` feature: no lab, benchmarks or vSphere provisioning in what users run (`make lint`).
RUN cargo build --release --locked --no-default-features --bin ferry

# The binary alone. A directory holding a `ferry` built elsewhere by the same cargo command replaces this stage (and
# the build stage is then skipped): --build-context binary=DIR (docker buildx, buildah, podman).
FROM scratch AS binary
COPY --from=build /src/target/release/ferry /ferry

FROM ${BASE}
# CA certificates for S3 and vCenter endpoints signed by public CAs. Ferry writes qcow2 itself; qemu-img is for
# guest adaptation's overlays. virt-v2v (with nbdkit for its input) adapts guests; before it, guestfish writes what
# keeps a Linux guest's interface names. libguestfs's appliance is built by supermin in the Job's scratch space from
# the image's own packages and kernel (2 s): a prebuilt one would be a 4 GiB sparse file, which image layers do not
# keep sparse. The kernel must be readable by the Jobs' users.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates qemu-utils virt-v2v nbdkit guestfish linux-image-amd64 \
    && chmod a+r /boot/vmlinuz-* \
    && rm -rf /var/lib/apt/lists/*
ENV LIBGUESTFS_BACKEND=direct
COPY --from=binary /ferry /usr/local/bin/ferry
USER 65532:65532
ENTRYPOINT ["ferry"]
