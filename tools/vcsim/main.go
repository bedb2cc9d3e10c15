// Command vcsim runs govmomi's vSphere simulator for Ferry's lab and tests.
// It prints one line "GOVC_URL=<url>" on stdout once it serves, then runs until SIGINT or SIGTERM.
package main

import (
	"bytes"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
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
	callsFile := flag.String("calls-file", "", "append each SOAP method name called, one per line (no arguments, so no credentials)")
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
	if *callsFile != "" {
		f, err := os.OpenFile(*callsFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			log.Fatalf("-calls-file: %v", err)
		}
		defer f.Close()
		// Set before the URL is printed, so before any client can call.
		s.Config.Handler = recordCalls(s.Config.Handler, f)
	}

	// Print the URL without credentials: the log must never carry the password.
	printable := *s.URL
	printable.User = nil
	fmt.Printf("GOVC_URL=%s\n", printable.String())
	os.Stdout.Sync()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}

var soapMethod = regexp.MustCompile(`Body[^>]*>\s*<(?:[A-Za-z0-9_]+:)?([A-Za-z0-9_]+)`)

// recordCalls writes the method name of every SOAP request to w: the lab's record of what clients asked of
// vSphere, which the chaos suite compares between runs.
func recordCalls(next http.Handler, w io.Writer) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/sdk") {
			body, err := io.ReadAll(r.Body)
			if err == nil {
				r.Body = io.NopCloser(bytes.NewReader(body))
				if m := soapMethod.FindSubmatch(body); m != nil {
					mu.Lock()
					fmt.Fprintf(w, "%s\n", m[1])
					mu.Unlock()
				}
			}
		}
		next.ServeHTTP(rw, r)
	})
}
