module libguestfs.org/libnbd

go 1.24
