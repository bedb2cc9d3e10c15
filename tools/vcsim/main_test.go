package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/view"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// The simulator runs in-process, each test with its own, over HTTPS as the lab serves it.

type testSim struct {
	*sim
	t    *testing.T
	http *http.Client
}

func startSim(t *testing.T, r realism) *testSim {
	t.Helper()
	// vcsim's datastores are directories under TMPDIR; the test's own goes with the test.
	t.Setenv("TMPDIR", t.TempDir())
	s, err := start(options{listen: "127.0.0.1:0", useTLS: true, vms: 1, user: "ferry", password: "secret", realism: r})
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		s.close()
	})
	return &testSim{sim: s, t: t, http: &http.Client{Transport: tr}}
}

// login opens a SOAP session with the simulator's credentials.
func (s *testSim) login() *govmomi.Client {
	s.t.Helper()
	c, err := govmomi.NewClient(context.Background(), s.server.URL, true)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// cookie is the session cookie the client got at login.
func (s *testSim) cookie(c *govmomi.Client) *http.Cookie {
	s.t.Helper()
	for _, k := range c.Client.Client.Jar.Cookies(s.server.URL) {
		if k.Name == soap.SessionCookieName {
			return k
		}
	}
	s.t.Fatal("no session cookie after login")
	return nil
}

func (s *testSim) folderURL(dcPath, dsName, file string) string {
	return fmt.Sprintf("https://%s/folder/%s?dcPath=%s&dsName=%s", s.server.URL.Host, file, url.QueryEscape(dcPath), url.QueryEscape(dsName))
}

// do sends a request with the cookie (when not nil) and reads the whole body; readErr is how the body ended.
func (s *testSim) do(method, u string, cookie *http.Cookie, body []byte, header ...string) (*http.Response, []byte, error) {
	s.t.Helper()
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if body == nil {
		req.Body = nil
	}
	if cookie != nil {
		req.AddCookie(cookie)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := s.http.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	got, readErr := io.ReadAll(resp.Body)
	return resp, got, readErr
}

// put uploads a file through /folder and expects it stored.
func (s *testSim) put(u string, cookie *http.Cookie, data []byte) {
	s.t.Helper()
	if resp, _, _ := s.do(http.MethodPut, u, cookie, data); resp.StatusCode != http.StatusOK {
		s.t.Fatalf("PUT %s: %s", u, resp.Status)
	}
}

func (s *testSim) expectStatus(method, u string, cookie *http.Cookie, want int) []byte {
	s.t.Helper()
	resp, body, err := s.do(method, u, cookie, nil)
	if err != nil {
		s.t.Fatalf("%s %s: body: %v", method, u, err)
	}
	if resp.StatusCode != want {
		s.t.Fatalf("%s %s: %s, want %d", method, u, resp.Status, want)
	}
	return body
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func currentTime(c *govmomi.Client) error {
	_, err := methods.GetCurrentTime(context.Background(), c)
	return err
}

func TestFolderNeedsLiveSessionAndSessionsExpireWhenIdle(t *testing.T) {
	s := startSim(t, realism{folderAuth: true, sessionIdle: time.Hour})
	clock := &fakeClock{now: time.Unix(1_000_000_000, 0)}
	s.sessions.now = clock.Now
	c := s.login()
	cookie := s.cookie(c)
	u := s.folderURL("DC0", "LocalDS_0", "auth/probe.bin")
	data := pattern(1 << 20)

	s.expectStatus(http.MethodPut, u, nil, http.StatusUnauthorized)
	s.put(u, cookie, data)
	s.expectStatus(http.MethodGet, u, nil, http.StatusUnauthorized)
	s.expectStatus(http.MethodGet, u, &http.Cookie{Name: soap.SessionCookieName, Value: "forged"}, http.StatusUnauthorized)
	if got := s.expectStatus(http.MethodGet, u, cookie, http.StatusOK); !bytes.Equal(got, data) {
		t.Fatal("GET with the session returned other bytes")
	}

	// A SOAP call refreshes the session: 80 minutes after login, 40 after the call, /folder still answers.
	clock.advance(40 * time.Minute)
	if err := currentTime(c); err != nil {
		t.Fatal(err)
	}
	clock.advance(40 * time.Minute)
	s.expectStatus(http.MethodGet, u, cookie, http.StatusOK)

	// A body already streaming is not cut when the session expires under it.
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.AddCookie(cookie)
	resp, err := s.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 1024)
	if _, err := io.ReadFull(resp.Body, head); err != nil {
		t.Fatal(err)
	}
	clock.advance(21 * time.Minute) // 61 minutes since the last SOAP call: the /folder GETs did not refresh it
	rest, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(append(head, rest...), data) {
		t.Fatalf("streaming body cut by expiry: %v", err)
	}

	// The next request with that cookie is refused, and SOAP says NotAuthenticated, as vcsim does.
	s.expectStatus(http.MethodGet, u, cookie, http.StatusUnauthorized)
	err = currentTime(c)
	if !soap.IsSoapFault(err) {
		t.Fatalf("SOAP on an expired session: %v, want a fault", err)
	}
	switch fault := soap.ToSoapFault(err).VimFault().(type) {
	case types.NotAuthenticated, *types.NotAuthenticated:
	default:
		t.Fatalf("SOAP on an expired session: %#v, want NotAuthenticated", fault)
	}

	// A new login gets a new live session; Logout ends it for /folder too.
	if err := c.Login(context.Background(), s.server.URL.User); err != nil {
		t.Fatal(err)
	}
	fresh := s.cookie(c)
	if fresh.Value == cookie.Value {
		t.Fatal("re-login kept the expired cookie")
	}
	s.expectStatus(http.MethodGet, u, fresh, http.StatusOK)
	if err := c.Logout(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.expectStatus(http.MethodGet, u, fresh, http.StatusUnauthorized)
}

func TestDatacenterInFolderNeedsFullDcPath(t *testing.T) {
	s := startSim(t, realism{dcFolder: "Folder1"})
	c := s.login()
	ctx := context.Background()
	data := pattern(4096)

	for _, bare := range []string{"DC0", "/DC0", "Folder1", ""} {
		s.expectStatus(http.MethodPut, s.folderURL(bare, "LocalDS_0", "dcpath/a.bin"), nil, http.StatusNotFound)
	}
	s.put(s.folderURL("Folder1/DC0", "LocalDS_0", "dcpath/a.bin"), nil, data)
	for _, full := range []string{"Folder1/DC0", "/Folder1/DC0"} {
		if got := s.expectStatus(http.MethodGet, s.folderURL(full, "LocalDS_0", "dcpath/a.bin"), nil, http.StatusOK); !bytes.Equal(got, data) {
			t.Fatalf("dcPath=%s: other bytes", full)
		}
	}
	s.expectStatus(http.MethodGet, s.folderURL("DC0", "LocalDS_0", "dcpath/a.bin"), nil, http.StatusNotFound)

	// The inventory around it still works: lookup by path, properties, power, CreateVM into the DC's vmFolder.
	index := object.NewSearchIndex(c.Client)
	if ref, err := index.FindByInventoryPath(ctx, "/DC0/vm/DC0_H0_VM0"); err != nil || ref != nil {
		t.Fatalf("the old path still finds %v (%v)", ref, err)
	}
	ref, err := index.FindByInventoryPath(ctx, "/Folder1/DC0/vm/DC0_H0_VM0")
	if err != nil || ref == nil {
		t.Fatalf("/Folder1/DC0/vm/DC0_H0_VM0: %v %v", ref, err)
	}
	vm := ref.(*object.VirtualMachine)
	if err := wait(vm.PowerOff(ctx)); err != nil {
		t.Fatal(err)
	}
	var props mo.VirtualMachine
	if err := vm.Properties(ctx, vm.Reference(), []string{"name", "runtime.powerState"}, &props); err != nil {
		t.Fatal(err)
	}
	if props.Name != "DC0_H0_VM0" || props.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOff {
		t.Fatalf("properties: %s %s", props.Name, props.Runtime.PowerState)
	}
	if err := wait(vm.PowerOn(ctx)); err != nil {
		t.Fatal(err)
	}

	finder := find.NewFinder(c.Client)
	dc, err := finder.Datacenter(ctx, "/Folder1/DC0")
	if err != nil {
		t.Fatal(err)
	}
	folders, err := dc.Folders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	finder.SetDatacenter(dc)
	host, err := finder.HostSystem(ctx, "DC0_H0")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := host.ResourcePool(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spec := types.VirtualMachineConfigSpec{Name: "created", GuestId: "otherGuest64", NumCPUs: 1, MemoryMB: 128,
		Files: &types.VirtualMachineFileInfo{VmPathName: "[LocalDS_0]"}}
	task, err := folders.VmFolder.CreateVM(ctx, spec, pool, host)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := task.WaitForResult(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if ref, err := index.FindByInventoryPath(ctx, "/Folder1/DC0/vm/created"); err != nil || ref == nil {
		t.Fatalf("created VM not under /Folder1/DC0/vm: %v", err)
	}
}

func TestDefaultsAreVcsimsOwn(t *testing.T) {
	s := startSim(t, realism{})
	c := s.login()
	u := s.folderURL("DC0", "LocalDS_0", "defaults/a.bin")
	data := pattern(64 << 10)
	s.put(u, nil, data)
	resp, body, err := s.do(http.MethodGet, u, nil, nil, "Range", "bytes=100-199")
	if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, data[100:200]) {
		t.Fatalf("Range by default: %s %v", resp.Status, err)
	}
	s.expectStatus(http.MethodGet, u, nil, http.StatusOK) // no session needed
	var hosts []mo.HostSystem
	retrieveAll(t, c, "HostSystem", []string{"summary.config"}, &hosts)
	for _, h := range hosts {
		if h.Summary.Config.SslThumbprint != "" {
			t.Fatalf("thumbprint set by default: %s", h.Summary.Config.SslThumbprint)
		}
	}
}

func TestFolderIgnoresRange(t *testing.T) {
	s := startSim(t, realism{folderIgnoreRange: true})
	u := s.folderURL("DC0", "LocalDS_0", "range/a.bin")
	data := pattern(64 << 10)
	s.put(u, nil, data)
	resp, body, err := s.do(http.MethodGet, u, nil, nil, "Range", "bytes=100-199")
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, data) {
		t.Fatalf("Range request: %s, %d bytes, %v; want 200 and the whole file", resp.Status, len(body), err)
	}
}

func TestFolderCutsFirstDownloadOfEachFileAtOffset(t *testing.T) {
	const cutAt = 300_000
	s := startSim(t, realism{folderCutAt: cutAt})
	data := pattern(1 << 20)
	for _, file := range []string{"cut/a.bin", "cut/b.bin"} {
		u := s.folderURL("DC0", "LocalDS_0", file)
		s.put(u, nil, data)
		resp, body, err := s.do(http.MethodGet, u, nil, nil)
		if resp.StatusCode != http.StatusOK || err == nil || len(body) != cutAt || !bytes.Equal(body, data[:cutAt]) {
			t.Fatalf("%s first GET: %s, %d bytes, %v; want the connection dropped after %d", file, resp.Status, len(body), err, cutAt)
		}
		// A resume from before the offset, and any later GET, go through.
		resp, body, err = s.do(http.MethodGet, u, nil, nil, "Range", fmt.Sprintf("bytes=%d-", cutAt-10))
		if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, data[cutAt-10:]) {
			t.Fatalf("%s resume: %s %v", file, resp.Status, err)
		}
		if got := s.expectStatus(http.MethodGet, u, nil, http.StatusOK); !bytes.Equal(got, data) {
			t.Fatalf("%s later GET: other bytes", file)
		}
	}
}

func TestFolderThrottlesEachDownload(t *testing.T) {
	const rate = 512 << 10
	s := startSim(t, realism{folderThrottle: rate})
	u := s.folderURL("DC0", "LocalDS_0", "slow/a.bin")
	data := pattern(256 << 10)
	s.put(u, nil, data)
	start := time.Now()
	got := s.expectStatus(http.MethodGet, u, nil, http.StatusOK)
	elapsed := time.Since(start)
	if !bytes.Equal(got, data) {
		t.Fatal("throttled GET returned other bytes")
	}
	// Only a lower bound: the server cannot be faster than the rate, a loaded machine can be slower.
	if min := time.Duration(float64(len(data)) / rate * 0.9 * float64(time.Second)); elapsed < min {
		t.Fatalf("%d bytes in %s: faster than %d B/s", len(data), elapsed, rate)
	}
	t.Logf("%d bytes in %s at %d B/s", len(data), elapsed, rate)
}

func TestFolder503BurstsThenServes(t *testing.T) {
	s := startSim(t, realism{folder503: 2})
	data := pattern(4096)
	for _, file := range []string{"busy/a.bin", "busy/b.bin"} {
		u := s.folderURL("DC0", "LocalDS_0", file)
		s.put(u, nil, data) // uploads are not refused, so a lab can seed its disks
		for i := 0; i < 2; i++ {
			if body := s.expectStatus(http.MethodGet, u, nil, http.StatusServiceUnavailable); !strings.Contains(string(body), "Out of HTTP sessions") {
				t.Fatalf("503 body: %q", body)
			}
		}
		if got := s.expectStatus(http.MethodGet, u, nil, http.StatusOK); !bytes.Equal(got, data) {
			t.Fatal("GET after the burst: other bytes")
		}
	}
}

func TestSoapDelay(t *testing.T) {
	const delay = 300 * time.Millisecond
	s := startSim(t, realism{soapDelay: delay})
	c := s.login()
	start := time.Now()
	if err := currentTime(c); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed < delay {
		t.Fatalf("SOAP answered in %s, before the %s delay", elapsed, delay)
	}
}

// retrieveAll reads props of every managed object of one kind through a container view.
func retrieveAll(t *testing.T, c *govmomi.Client, kind string, props []string, dst any) {
	t.Helper()
	ctx := context.Background()
	v, err := view.NewManager(c.Client).CreateContainerView(ctx, c.ServiceContent.RootFolder, []string{kind}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Destroy(ctx)
	if err := v.Retrieve(ctx, []string{kind}, props, dst); err != nil {
		t.Fatal(err)
	}
}

func TestHostThumbprintIsSHA1OfServedCertificate(t *testing.T) {
	s := startSim(t, realism{hostThumbprint: true})
	conn, err := tls.Dial("tcp", s.server.URL.Host, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	want := sha1Thumbprint(conn.ConnectionState().PeerCertificates[0].Raw)
	conn.Close()
	if !regexp.MustCompile(`^([0-9A-F]{2}:){19}[0-9A-F]{2}$`).MatchString(want) {
		t.Fatalf("thumbprint format: %s", want)
	}
	var hosts []mo.HostSystem
	retrieveAll(t, s.login(), "HostSystem", []string{"name", "summary.config"}, &hosts)
	if len(hosts) < 4 {
		t.Fatalf("%d hosts", len(hosts))
	}
	for _, h := range hosts {
		if got := h.Summary.Config.SslThumbprint; got != want {
			t.Fatalf("%s: sslThumbprint %q, want %q", h.Name, got, want)
		}
	}
}
