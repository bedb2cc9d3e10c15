package main

import (
	"crypto/sha1"
	"fmt"
	"strings"

	"github.com/vmware/govmomi/simulator"
)

// sha1Thumbprint formats a certificate's SHA-1 as vCenter shows host thumbprints: colon-separated uppercase hex
// ("AB:CD:..."), as in HostSystem summary.config.sslThumbprint (the property Forklift reads).
func sha1Thumbprint(der []byte) string {
	sum := sha1.Sum(der)
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}

// setHostThumbprints gives every host the thumbprint of the certificate vcsim serves (vcsim leaves it empty):
// in the lab every host is reached at vcsim's own address.
func setHostThumbprints(m *simulator.Model, certDER []byte) {
	ctx := m.Service.Context
	thumbprint := sha1Thumbprint(certDER)
	for _, e := range ctx.Map.All("HostSystem") {
		host := e.(*simulator.HostSystem)
		ctx.WithLock(host, func() {
			host.Summary.Config.SslThumbprint = thumbprint
		})
	}
}
