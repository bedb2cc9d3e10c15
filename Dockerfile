# The `ferry` image: the controller (`ferry controller`) and the conversion and verification Jobs
# (`ferry convert`, `ferry verify`) run the same binary. Build: docker build -t REGISTRY/ferry:0.1.0 .
FROM rust:1-trixie AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin ferry

FROM debian:trixie-slim
# CA certificates for S3 and vCenter endpoints signed by public CAs. Ferry writes qcow2 itself: no qemu-img.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/ferry /usr/local/bin/ferry
USER 65532:65532
ENTRYPOINT ["ferry"]
