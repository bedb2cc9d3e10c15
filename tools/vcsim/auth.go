package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/simulator/sim25"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/soap"
)

// sessions tracks the SOAP sessions the wrapper saw being created, so that /folder and SOAP agree on which are
// live: vcsim's own session map is private, and its idle check only runs every `timeout` (a session can
// outlive it by up to twice the timeout).
type sessions struct {
	mu   sync.Mutex
	idle time.Duration // 0: sessions never expire
	now  func() time.Time
	// last SOAP activity per session cookie
	last map[string]time.Time
}

func newSessions(idle time.Duration) *sessions {
	return &sessions{idle: idle, now: time.Now, last: map[string]time.Time{}}
}

func (s *sessions) login(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last[key] = s.now()
}

func (s *sessions) logout(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.last, key)
}

// live says whether the session is known and not idle for longer than allowed; touch (SOAP calls) refreshes
// its idle timer, a /folder transfer does not (the stricter assumption: not verified on a real vCenter).
func (s *sessions) live(key string, touch bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, ok := s.last[key]
	if !ok {
		return false
	}
	now := s.now()
	if s.idle > 0 && now.Sub(last) > s.idle {
		delete(s.last, key)
		return false
	}
	if touch {
		s.last[key] = now
	}
	return true
}

// sessionKey is the vmware_soap_session cookie of r, or "".
func sessionKey(r *http.Request) string {
	if c, err := r.Cookie(soap.SessionCookieName); err == nil {
		return c.Value
	}
	return ""
}

// dropSessionCookie removes the session cookie from r, keeping any other cookie.
func dropSessionCookie(r *http.Request) {
	others := []string{}
	for _, c := range r.Cookies() {
		if c.Name != soap.SessionCookieName {
			others = append(others, c.String())
		}
	}
	r.Header.Del("Cookie")
	if len(others) > 0 {
		r.Header.Set("Cookie", strings.Join(others, "; "))
	}
}

// setSessionTimeout sets vcsim's own idle timeout too, so its session list drops expired sessions. The wrapper
// decides first: it sees each call before vcsim does, so its idle clock never runs behind vcsim's.
func setSessionTimeout(m *simulator.Model, idle time.Duration) error {
	ctx := context.Background()
	c, err := vim25.NewClient(ctx, m.Service)
	if err != nil {
		return err
	}
	return sim25.SetSessionTimeout(ctx, c, idle)
}

var (
	soapMethod        = regexp.MustCompile(`Body[^>]*>\s*<(?:[A-Za-z0-9_]+:)?([A-Za-z0-9_]+)`)
	terminatedSession = regexp.MustCompile(`<(?:[A-Za-z0-9_]+:)?sessionId[^>]*>([^<]+)<`)
)

// handler routes /sdk through soap and /folder through the folder faults, around vcsim's own mux.
func (s *sim) handler(next http.Handler, calls io.Writer, delay time.Duration) http.Handler {
	soapHandler := s.soap(next, calls, delay)
	folderHandler := s.folder.wrap(next, s.sessions)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/sdk"):
			soapHandler.ServeHTTP(rw, r)
		case strings.HasPrefix(r.URL.Path, "/folder/"):
			folderHandler.ServeHTTP(rw, r)
		case r.URL.Path == guestNetPath:
			s.guestNet(rw, r)
		case r.URL.Path == guestDiskPath:
			s.guestDiskHandler(rw, r)
		case r.URL.Path == cbtResetPath:
			s.cbtResetHandler(rw, r)
		case r.URL.Path == folderLockAt:
			s.folderLockHandler(rw, r)
		default:
			next.ServeHTTP(rw, r)
		}
	})
}

// soap records each SOAP method name to calls (the lab's record of what clients asked of vSphere, which the
// chaos suite compares between runs), delays the answer, and keeps the session table: an expired session's
// cookie is withheld from vcsim, which then answers as it does for any call without a session (the
// NotAuthenticated fault).
func (s *sim) soap(next http.Handler, calls io.Writer, delay time.Duration) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		method := ""
		var body []byte
		if calls != nil || s.sessions != nil || s.cbt != nil {
			var err error
			body, err = io.ReadAll(r.Body)
			if err == nil {
				r.Body = io.NopCloser(bytes.NewReader(body))
				if m := soapMethod.FindSubmatch(body); m != nil {
					method = string(m[1])
				}
			}
		}
		if calls != nil && method != "" {
			mu.Lock()
			fmt.Fprintf(calls, "%s\n", method)
			mu.Unlock()
		}
		key := sessionKey(r)
		if s.sessions != nil && key != "" && !s.sessions.live(key, true) {
			dropSessionCookie(r)
			key = ""
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		serve := next
		if s.cbt != nil && method == "QueryChangedDiskAreas" {
			serve = s.cbt.queryHandler(next, body, s.model.Service.Context)
		}
		if s.sessions == nil {
			serve.ServeHTTP(rw, r)
			return
		}
		// A new session (Login, LoginByToken, CloneSession...) shows as a Set-Cookie on its answer; it is
		// recorded before the answer leaves, so a client's next request always finds it.
		rec := &statusRecorder{ResponseWriter: rw, onHeader: func(h http.Header) {
			for _, c := range (&http.Response{Header: h}).Cookies() {
				if c.Name == soap.SessionCookieName && c.Value != "" {
					s.sessions.login(c.Value)
				}
			}
		}}
		serve.ServeHTTP(rec, r)
		if rec.status == http.StatusOK {
			switch method {
			case "Logout":
				s.sessions.logout(key)
			case "TerminateSession": // another session ended by an administrator
				for _, m := range terminatedSession.FindAllSubmatch(body, -1) {
					s.sessions.logout(string(m[1]))
				}
			}
		}
	})
}

// statusRecorder remembers the status code of an answer and shows its headers to onHeader before they are sent.
type statusRecorder struct {
	http.ResponseWriter
	status   int
	onHeader func(http.Header)
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		w.onHeader(w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}
