// Command vcsim runs govmomi's vSphere simulator for Ferry's lab and tests.
// It prints one line "GOVC_URL=<url>" on stdout once it serves, then runs until SIGINT or SIGTERM.
//
// Flags make it behave more like a production vCenter than vcsim does by default (all off by default):
// sessions on /folder (auth.go), a datacenter inside a folder (dcfolder.go), transfer faults on /folder
// (folder.go), storage Ferry must refuse (fixtures.go) and hosts' SHA-1 thumbprints (thumbprint.go).
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/vmware/govmomi/simulator"
)

// options is everything the flags set.
type options struct {
	listen    string
	esx       bool
	user      string
	password  string
	useTLS    bool
	vms       int
	hosts     int
	certFile  string
	keyFile   string
	callsFile io.Writer
	realism   realism
}

// realism: the production-like behaviours, each off when zero.
type realism struct {
	// folderAuth: /folder answers 401 unless the request carries a live vmware_soap_session cookie.
	folderAuth bool
	// sessionIdle: a session expires after this long without a SOAP call (0: never).
	sessionIdle time.Duration
	// dcFolder: the datacenters move into this root-level folder, and /folder wants dcPath as the full path.
	dcFolder string
	// folderThrottle: bytes per second of each /folder download (0: unlimited).
	folderThrottle int64
	// folderCutAt: the first download of each file that reaches this offset loses its connection there (0: off).
	folderCutAt int64
	// folderIgnoreRange: /folder answers a Range request with 200 and the whole file.
	folderIgnoreRange bool
	// folder503: the first N downloads of each file answer 503.
	folder503 int
	// soapDelay: each SOAP answer is delayed this long.
	soapDelay time.Duration
	// fixtures: add VMs on storage Ferry must refuse (vSAN, vVol, encrypted, seSparse, multi-extent).
	fixtures bool
	// hostThumbprint: hosts' summary.config.sslThumbprint is the served certificate's SHA-1, as vCenter shows it.
	hostThumbprint bool
	// cbt: Changed Block Tracking, snapshot layers and QueryChangedDiskAreas (cbt*.go).
	cbt bool
	// cbtMaxAreas: areas per QueryChangedDiskAreas answer.
	cbtMaxAreas int
	// cbtWindow: bytes of disk one answer covers at most (0: the rest of the disk).
	cbtWindow int64
	// folderLock: which flat files of running VMs /folder refuses (off, running, base).
	folderLock string
}

func main() {
	var o options
	var passFile, callsFile string
	flag.StringVar(&o.listen, "l", "127.0.0.1:0", "listen address (port 0 picks a free port)")
	flag.BoolVar(&o.esx, "esx", false, "standalone ESXi model instead of vCenter")
	flag.StringVar(&o.user, "username", "", "required user name (empty: any)")
	flag.StringVar(&passFile, "password-file", "", "file holding the required password (kept out of argv)")
	flag.BoolVar(&o.useTLS, "tls", true, "serve HTTPS with a generated self-signed certificate")
	flag.IntVar(&o.vms, "vm", 2, "VMs per resource pool or host")
	flag.IntVar(&o.hosts, "hosts", 0, "ESXi hosts, each with -vm VMs: N-1 standalone and a cluster of one (0: the model's 1 standalone and a cluster of 3)")
	flag.StringVar(&o.certFile, "tlscert", "", "PEM certificate to serve (default: a generated self-signed one)")
	flag.StringVar(&o.keyFile, "tlskey", "", "PEM private key of -tlscert")
	flag.StringVar(&callsFile, "calls-file", "", "append each SOAP method name called, one per line (no arguments, so no credentials)")
	r := &o.realism
	flag.BoolVar(&r.folderAuth, "folder-auth", false, "/folder answers 401 without a live vmware_soap_session cookie")
	flag.DurationVar(&r.sessionIdle, "session-idle", 0, "sessions expire after this idle time; SOAP calls refresh it, /folder does not (0: never)")
	flag.StringVar(&r.dcFolder, "dc-folder", "", "move the datacenters into this root folder; /folder then wants dcPath=NAME/DC (404 for the bare name)")
	flag.Int64Var(&r.folderThrottle, "folder-throttle", 0, "bytes per second of each /folder download (0: unlimited)")
	flag.Int64Var(&r.folderCutAt, "folder-cut-at", 0, "drop the connection of the first download of each file that reaches this offset (0: off)")
	flag.BoolVar(&r.folderIgnoreRange, "folder-ignore-range", false, "answer Range downloads with 200 and the whole file")
	flag.IntVar(&r.folder503, "folder-503", 0, "the first N downloads of each file answer 503 \"Out of HTTP sessions\"")
	flag.DurationVar(&r.soapDelay, "soap-delay", 0, "delay each SOAP answer")
	flag.BoolVar(&r.fixtures, "fixtures", false, "add VMs on vSAN, vVol, encrypted, seSparse and multi-extent disks")
	flag.BoolVar(&r.hostThumbprint, "host-thumbprint", false, "hosts' summary.config.sslThumbprint = SHA-1 of the served certificate")
	flag.BoolVar(&r.cbt, "cbt", false, "Changed Block Tracking: change IDs, snapshot layers, QueryChangedDiskAreas and /ferry-lab/disk")
	flag.IntVar(&r.cbtMaxAreas, "cbt-max-areas", 2000, "areas per QueryChangedDiskAreas answer (ESXi: about 2,000)")
	flag.Int64Var(&r.cbtWindow, "cbt-window", 0, "bytes of disk one QueryChangedDiskAreas answer covers at most (0: the rest of the disk)")
	flag.StringVar(&r.folderLock, "folder-lock", "off", "flat files of running VMs /folder answers 500 for: off, running (written ones), base (also a snapshot's base)")
	flag.Parse()

	if o.user != "" {
		pass, err := os.ReadFile(passFile)
		if err != nil {
			log.Fatalf("-username needs a readable -password-file: %v", err)
		}
		o.password = strings.TrimSpace(string(pass))
	}
	if callsFile != "" {
		f, err := os.OpenFile(callsFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			log.Fatalf("-calls-file: %v", err)
		}
		defer f.Close()
		o.callsFile = f
	}

	sim, err := start(o)
	if err != nil {
		log.Fatal(err)
	}
	defer sim.close()

	// Print the URL without credentials: the log must never carry the password.
	printable := *sim.server.URL
	printable.User = nil
	fmt.Printf("GOVC_URL=%s\n", printable.String())
	os.Stdout.Sync()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}

// sim is a running simulator with its wrapper.
type sim struct {
	model    *simulator.Model
	server   *simulator.Server
	sessions *sessions
	folder   *folderFaults
	cbt      *cbtModel // nil without -cbt
}

func (s *sim) close() {
	s.server.Close()
	s.model.Remove()
	if s.cbt != nil {
		s.cbt.close()
	}
}

// start builds the inventory, shapes it as the realism options ask, and serves it.
func start(o options) (*sim, error) {
	r := o.realism
	if o.esx && (r.dcFolder != "" || r.fixtures) {
		return nil, fmt.Errorf("-dc-folder and -fixtures need the vCenter model (no -esx)")
	}
	m := simulator.VPX()
	if o.esx {
		m = simulator.ESX()
	}
	m.Machine = o.vms
	if o.hosts > 0 {
		if o.esx {
			return nil, fmt.Errorf("-hosts needs the vCenter model (no -esx)")
		}
		m.Host = o.hosts - 1
		m.ClusterHost = 1
	}
	if err := m.Create(); err != nil {
		return nil, err
	}
	s := &sim{model: m}
	fail := func(err error) (*sim, error) {
		if s.server != nil {
			s.server.Close()
		}
		m.Remove()
		if s.cbt != nil {
			s.cbt.close()
		}
		return nil, err
	}
	lock, err := parseFolderLock(r.folderLock)
	if err != nil {
		return fail(err)
	}
	if r.dcFolder != "" {
		if err := moveDatacenters(m, r.dcFolder); err != nil {
			return fail(fmt.Errorf("-dc-folder: %w", err))
		}
	}
	if r.fixtures {
		if err := addFixtures(m); err != nil {
			return fail(fmt.Errorf("-fixtures: %w", err))
		}
	}
	if r.cbt {
		if s.cbt, err = newCBTModel(r.cbtMaxAreas, r.cbtWindow); err != nil {
			return fail(fmt.Errorf("-cbt: %w", err))
		}
		s.cbt.install(m)
	}
	if r.sessionIdle > 0 {
		if err := setSessionTimeout(m, r.sessionIdle); err != nil {
			return fail(fmt.Errorf("-session-idle: %w", err))
		}
	}

	u := &url.URL{Host: o.listen}
	if o.user != "" {
		u.User = url.UserPassword(o.user, o.password)
	}
	m.Service.Listen = u
	if o.useTLS {
		m.Service.TLS = new(tls.Config)
		if o.certFile != "" {
			cert, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
			if err != nil {
				return fail(fmt.Errorf("loading -tlscert/-tlskey: %w", err))
			}
			m.Service.TLS.Certificates = []tls.Certificate{cert}
		}
	}
	s.server = m.Service.NewServer()
	if r.hostThumbprint && o.useTLS {
		setHostThumbprints(m, s.server.TLS.Certificates[0].Certificate[0])
	}

	if r.folderAuth || r.sessionIdle > 0 {
		s.sessions = newSessions(r.sessionIdle)
	}
	paths, err := datacenterPaths(m)
	if err != nil {
		return fail(err)
	}
	s.folder = newFolderFaults(r, paths, m.Service.Context)
	s.folder.lock.Store(int32(lock))
	// Set before the URL is printed, so before any client can call.
	s.server.Config.Handler = s.handler(s.server.Config.Handler, o.callsFile, r.soapDelay)
	return s, nil
}
