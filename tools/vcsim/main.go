// Command vcsim runs govmomi's vSphere simulator for Ferry's lab and tests.
// It prints one line "GOVC_URL=<url>" on stdout once it serves, then runs until SIGINT or SIGTERM.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/vmware/govmomi/simulator"
)

func main() {
	listen := flag.String("l", "127.0.0.1:0", "listen address (port 0 picks a free port)")
	esx := flag.Bool("esx", false, "standalone ESXi model instead of vCenter")
	user := flag.String("username", "", "required user name (empty: any)")
	passFile := flag.String("password-file", "", "file holding the required password (kept out of argv)")
	useTLS := flag.Bool("tls", true, "serve HTTPS with a generated self-signed certificate")
	vms := flag.Int("vm", 2, "VMs per resource pool or host")
	certFile := flag.String("tlscert", "", "PEM certificate to serve (default: a generated self-signed one)")
	keyFile := flag.String("tlskey", "", "PEM private key of -tlscert")
	flag.Parse()

	m := simulator.VPX()
	if *esx {
		m = simulator.ESX()
	}
	m.Machine = *vms
	if err := m.Create(); err != nil {
		log.Fatal(err)
	}
	defer m.Remove()

	u := &url.URL{Host: *listen}
	if *user != "" {
		pass, err := os.ReadFile(*passFile)
		if err != nil {
			log.Fatalf("-username needs a readable -password-file: %v", err)
		}
		u.User = url.UserPassword(*user, strings.TrimSpace(string(pass)))
	}
	m.Service.Listen = u
	if *useTLS {
		m.Service.TLS = new(tls.Config)
		if *certFile != "" {
			cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
			if err != nil {
				log.Fatalf("loading -tlscert/-tlskey: %v", err)
			}
			m.Service.TLS.Certificates = []tls.Certificate{cert}
		}
	}
	s := m.Service.NewServer()
	defer s.Close()

	// Print the URL without credentials: the log must never carry the password.
	printable := *s.URL
	printable.User = nil
	fmt.Printf("GOVC_URL=%s\n", printable.String())
	os.Stdout.Sync()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
