package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// sessionCookie names the session cookie.
const sessionCookie = "gantry_session"

// csrfField is the form field (and csrfHeader the header) a POST carries
// its CSRF token in.
const (
	csrfField  = "csrf"
	csrfHeader = "X-CSRF-Token"
)

// session is one login, or one browser of a loopback dashboard without
// users.
type session struct {
	id      string
	user    string
	role    Role
	csrf    string
	expires time.Time
	flash   *flash
}

// flash is a message shown once, on the next page a session sees.
type flash struct {
	// Kind is "ok" or "error".
	Kind string
	Text string
}

// sessions holds the live sessions, in memory: a restart logs everyone
// out.
type sessions struct {
	mu  sync.Mutex
	ttl time.Duration
	m   map[string]*session
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, m: map[string]*session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// create starts a session for user and drops the expired ones.
func (s *sessions) create(user string, role Role) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, x := range s.m {
		if now.After(x.expires) {
			delete(s.m, id)
		}
	}
	x := &session{id: randomToken(), user: user, role: role, csrf: randomToken(), expires: now.Add(s.ttl)}
	s.m[x.id] = x
	return x
}

// get returns the live session id and extends it, or nil.
func (s *sessions) get(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, ok := s.m[id]
	if !ok {
		return nil
	}
	if time.Now().After(x.expires) {
		delete(s.m, id)
		return nil
	}
	x.expires = time.Now().Add(s.ttl)
	return x
}

func (s *sessions) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

func (s *sessions) setFlash(x *session, f *flash) {
	s.mu.Lock()
	defer s.mu.Unlock()
	x.flash = f
}

func (s *sessions) takeFlash(x *session) *flash {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := x.flash
	x.flash = nil
	return f
}

// principal is who makes a request.
type principal struct {
	User string
	Role Role
	// CSRF is the token the request's forms carry.
	CSRF string
	// Local says the dashboard serves loopback without users.
	Local bool
	sess  *session
}

// Can reports whether the principal's role allows action.
func (p *principal) Can(action string) bool { return p != nil && p.Role.Allows(action) }

type principalKey struct{}

func principalOf(r *http.Request) *principal {
	p, _ := r.Context().Value(principalKey{}).(*principal)
	return p
}

// authenticate lets in the requests the dashboard's mode allows, with
// their principal, and refuses a POST without the principal's CSRF token
// or from another origin.
func (d *Dashboard) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p *principal
		switch d.mode {
		case modeClosed:
			d.fail(w, r, http.StatusForbidden, ErrInsecure)
			return
		case modeLocal:
			// A loopback dashboard answers only to loopback names, so
			// that a web page whose DNS name was rebound to 127.0.0.1
			// cannot read it.
			if !isLoopback(hostOnly(r.Host)) {
				d.fail(w, r, http.StatusForbidden, errors.New("this dashboard serves loopback: open it as http://127.0.0.1 or http://localhost"))
				return
			}
			p = d.localPrincipal(w, r)
			if r.URL.Path == "/login" {
				http.Redirect(w, r, "/", http.StatusSeeOther)
				return
			}
		case modeUsers:
			p = d.userPrincipal(r)
			if p == nil && r.URL.Path != "/login" {
				d.unauthenticated(w, r)
				return
			}
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if !sameOrigin(r) {
				d.fail(w, r, http.StatusForbidden, errors.New("a request from another site is refused"))
				return
			}
			if r.URL.Path != "/login" && !validCSRF(p, r) {
				d.fail(w, r, http.StatusForbidden, errors.New("the form's security token is missing or out of date: reload the page and try again"))
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// localPrincipal is LocalUser, in the browser's session (made if it has
// none), whose token its forms carry.
func (d *Dashboard) localPrincipal(w http.ResponseWriter, r *http.Request) *principal {
	x := d.sessionOf(r)
	if x == nil {
		x = d.session.create(LocalUser, RoleOperator)
		d.setCookie(w, x.id)
	}
	return &principal{User: x.user, Role: x.role, CSRF: x.csrf, Local: true, sess: x}
}

// userPrincipal is the logged-in user of the request's session, or the
// user its HTTP basic authentication names over TLS; nil if none.
func (d *Dashboard) userPrincipal(r *http.Request) *principal {
	if x := d.sessionOf(r); x != nil {
		return &principal{User: x.user, Role: x.role, CSRF: x.csrf, sess: x}
	}
	name, password, ok := r.BasicAuth()
	if !ok || r.TLS == nil {
		return nil
	}
	u, ok := d.check(name, password)
	if !ok {
		return nil
	}
	return &principal{User: u.Name, Role: u.Role, CSRF: d.basicToken(u.Name)}
}

func (d *Dashboard) sessionOf(r *http.Request) *session {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	return d.session.get(c.Value)
}

// basicToken is the CSRF token of a user authenticated with HTTP basic:
// the same on every request, and secret.
func (d *Dashboard) basicToken(user string) string {
	m := hmac.New(sha256.New, d.key)
	m.Write([]byte("basic\x00" + user))
	return hex.EncodeToString(m.Sum(nil))
}

// check returns the user name and password name, or false. It compares
// in constant time, and as long for an unknown name.
func (d *Dashboard) check(name, password string) (User, bool) {
	u, known := d.users[name]
	want := u.Password
	if !known {
		want = string(d.key)
	}
	match := subtle.ConstantTimeCompare([]byte(password), []byte(want)) == 1
	return u, known && match
}

// unauthenticated sends a browser to the login page, and answers anything
// else 401.
func (d *Dashboard) unauthenticated(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	if d.cfg.TLS {
		w.Header().Set("WWW-Authenticate", `Basic realm="gantry", charset="UTF-8"`)
	}
	http.Error(w, "log in first: "+r.URL.Path+" needs a user", http.StatusUnauthorized)
}

// setCookie sets the session cookie to value, or deletes it when value is
// empty. It lasts as long as the browser runs.
func (d *Dashboard) setCookie(w http.ResponseWriter, value string) {
	c := &http.Cookie{Name: sessionCookie, Value: value, Path: "/", HttpOnly: true, Secure: d.cfg.TLS, SameSite: http.SameSiteStrictMode}
	if value == "" {
		c.MaxAge = -1
	}
	http.SetCookie(w, c)
}

// validCSRF reports whether r carries p's token.
func validCSRF(p *principal, r *http.Request) bool {
	if p == nil {
		return false
	}
	got := r.Header.Get(csrfHeader)
	if got == "" {
		got = r.PostFormValue(csrfField)
	}
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(p.CSRF)) == 1
}

// sameOrigin reports whether a browser sent r from the dashboard's own
// pages: its Origin (or, without one, Sec-Fetch-Site) says so. A request
// with neither is not a browser's cross-site one.
func sameOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
	}
	site := r.Header.Get("Sec-Fetch-Site")
	return site == "" || site == "same-origin" || site == "none"
}

// hostOnly returns the host of a Host header.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

// localPath returns next if it is a path on this site, else "/".
func localPath(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return "/"
	}
	return next
}

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	if p := principalOf(r); p != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	d.render(w, r, http.StatusOK, "login", "Log in", map[string]any{"Next": localPath(r.URL.Query().Get("next")), "TLS": d.cfg.TLS})
}

func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	name, password := r.PostFormValue("user"), r.PostFormValue("password")
	next := localPath(r.PostFormValue("next"))
	u, ok := d.check(name, password)
	var problem string
	switch {
	case !ok:
		problem = "unknown user or wrong password"
	case !u.Role.person():
		problem = "the role " + string(u.Role) + " is a component's: log in as a person (operator, submitter or viewer)"
	}
	if problem != "" {
		d.log.Warn("dashboard login refused", "user", name, "remote", r.RemoteAddr, "err", problem)
		d.render(w, r, http.StatusUnauthorized, "login", "Log in", map[string]any{"Next": next, "User": name, "Error": problem, "TLS": d.cfg.TLS})
		return
	}
	x := d.session.create(u.Name, u.Role)
	d.setCookie(w, x.id)
	d.log.Info("dashboard login", "user", u.Name, "role", u.Role, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if p := principalOf(r); p != nil && p.sess != nil {
		d.session.drop(p.sess.id)
	}
	d.setCookie(w, "")
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
