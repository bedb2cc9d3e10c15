package main

import (
	"fmt"
	"log"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmware/govmomi/simulator"
)

// folderFaults shapes the /folder datastore endpoint like a production vCenter: sessions, full dcPath, and the
// transfer faults a long download meets (throttling, a cut connection, Range ignored, 503 bursts).
// The transfer faults hit downloads (GET, HEAD) only, so a lab can still upload its disks.
type folderFaults struct {
	r realism
	// dcPaths: the datacenters' inventory paths without a leading '/' ("Folder1/DC0"), enforced with -dc-folder.
	dcPaths map[string]bool

	mu sync.Mutex
	// downloads started per file, for the 503 bursts
	downloads map[string]int
	// files whose first download reaching -folder-cut-at was cut
	cut map[string]bool
	// lock: a folderLock, set by -folder-lock and PUT /ferry-lab/folder-lock
	lock atomic.Int32
	ctx  *simulator.Context
}

// outOfSessions is what vCenter's reverse proxy answers beyond its HTTP session cap (kubernetes/kops#2747).
const outOfSessions = "503 Service Unavailable (Out of HTTP sessions: Limited to 2000)"

func newFolderFaults(r realism, dcPaths []string, ctx *simulator.Context) *folderFaults {
	f := &folderFaults{r: r, dcPaths: map[string]bool{}, downloads: map[string]int{}, cut: map[string]bool{}, ctx: ctx}
	for _, p := range dcPaths {
		f.dcPaths[p] = true
	}
	return f
}

func (f *folderFaults) wrap(next http.Handler, sess *sessions) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		// Real vCenter refuses /folder without a session (virt-v2v input/vCenter.ml expects the 401).
		if f.r.folderAuth {
			if key := sessionKey(r); key == "" || !sess.live(key, false) {
				log.Printf("fault: 401 for %s %s (no live session)", r.Method, r.URL.Path)
				http.Error(rw, "401 Unauthorized", http.StatusUnauthorized)
				return
			}
		}
		// Real vCenter takes dcPath as the datacenter's inventory path only (vmware/govmomi#285), where vcsim's
		// finder would also find a bare name anywhere below the root.
		if f.r.dcFolder != "" {
			q := r.URL.Query()
			p := strings.TrimPrefix(q.Get("dcPath"), "/")
			if !f.dcPaths[p] {
				http.NotFound(rw, r)
				return
			}
			q.Set("dcPath", "/"+p)
			r.URL.RawQuery = q.Encode()
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			next.ServeHTTP(rw, r)
			return
		}
		file := fmt.Sprintf("%s?dsName=%s", r.URL.Path, r.URL.Query().Get("dsName"))
		if ds, path := folderPath(r.URL); lockedFlat(f.ctx, folderLock(f.lock.Load()), ds, path) {
			log.Printf("fault: 500 for %s %s (a running VM holds it)", r.Method, file)
			msg := fmt.Sprintf("500 Internal Server Error: cannot open %s since it is locked by a running virtual machine", path)
			http.Error(rw, msg, http.StatusInternalServerError)
			return
		}
		if f.r.folder503 > 0 && f.started(file) <= f.r.folder503 {
			log.Printf("fault: 503 for %s %s", r.Method, file)
			http.Error(rw, outOfSessions, http.StatusServiceUnavailable)
			return
		}
		if f.r.folderIgnoreRange {
			if rg := r.Header.Get("Range"); rg != "" {
				log.Printf("fault: Range %q ignored for %s", rg, file)
			}
			r.Header.Del("Range")
			r.Header.Del("If-Range")
		}
		if r.Method == http.MethodHead || (f.r.folderThrottle <= 0 && f.r.folderCutAt <= 0) {
			next.ServeHTTP(rw, r)
			return
		}
		next.ServeHTTP(&shapedWriter{ResponseWriter: rw, faults: f, file: file}, r)
	})
}

// started counts one more download of file and returns the count.
func (f *folderFaults) started(file string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.downloads[file]++
	return f.downloads[file]
}

// claimCut says whether this download of file is the one to cut (the first to reach the offset).
func (f *folderFaults) claimCut(file string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut[file] {
		return false
	}
	f.cut[file] = true
	return true
}

// shapedWriter throttles a download's body and cuts it at an offset of the file.
type shapedWriter struct {
	http.ResponseWriter
	faults *folderFaults
	file   string
	status int
	// offset: where in the file the next body byte is (a 206 starts at its Content-Range)
	offset  int64
	sent    int64
	started time.Time
}

func (w *shapedWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		w.started = time.Now()
		if code == http.StatusPartialContent {
			w.offset = rangeStart(w.Header().Get("Content-Range"))
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *shapedWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.status != http.StatusOK && w.status != http.StatusPartialContent {
		return w.ResponseWriter.Write(b)
	}
	rate, cutAt := w.faults.r.folderThrottle, w.faults.r.folderCutAt
	written := 0
	for written < len(b) {
		chunk := b[written:]
		if rate > 0 {
			// Small chunks, so the rate holds within each second.
			chunk = chunk[:min(int64(len(chunk)), max(1, min(rate/16, 32<<10)))]
		}
		if rate > 0 {
			// Wait before sending, so that by any time t the client has had at most rate*t bytes.
			due := w.started.Add(time.Duration(float64(w.sent+int64(len(chunk))) / float64(rate) * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
		}
		if cutAt > 0 && w.offset <= cutAt && w.offset+int64(len(chunk)) > cutAt && w.faults.claimCut(w.file) {
			log.Printf("fault: connection cut at byte %d of %s", cutAt, w.file)
			n, _ := w.ResponseWriter.Write(chunk[:cutAt-w.offset])
			w.sent += int64(n)
			_ = http.NewResponseController(w.ResponseWriter).Flush()
			// Drops the connection without finishing the body: the client sees it end early.
			panic(http.ErrAbortHandler)
		}
		n, err := w.ResponseWriter.Write(chunk)
		written += n
		w.offset += int64(n)
		w.sent += int64(n)
		if err != nil {
			return written, err
		}
		if rate > 0 {
			_ = http.NewResponseController(w.ResponseWriter).Flush()
		}
	}
	return written, nil
}

// rangeStart is the first byte of a Content-Range "bytes FIRST-LAST/SIZE", or 0.
func rangeStart(contentRange string) int64 {
	var first, last, size int64
	if _, err := fmt.Sscanf(contentRange, "bytes %d-%d/%d", &first, &last, &size); err != nil {
		return 0
	}
	return first
}
