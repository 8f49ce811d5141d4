package dashboard

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/lifecycle"
)

// Defaults of Config.
const (
	// DefaultSessionTTL is how long a login lasts without a request.
	DefaultSessionTTL = 12 * time.Hour
	// DefaultRefresh is how often a page refreshes its live parts.
	DefaultRefresh = 2 * time.Second
	// DefaultStatsTTL is how long a picture of the system (client.Stats)
	// is reused by the pages that show it.
	DefaultStatsTTL = 2 * time.Second
)

// LocalUser is the user a dashboard served on loopback without users acts
// as.
const LocalUser = "local"

// ErrInsecure is the error of a dashboard that listens beyond loopback
// without users: it refuses every request.
var ErrInsecure = errors.New("the dashboard listens beyond loopback without users: configure users (auth.users in the config file) or listen on 127.0.0.1")

//go:embed web
var webFS embed.FS

// Config configures a Dashboard.
type Config struct {
	// Listen is the host:port the dashboard is served on. On loopback
	// without Users it needs no login; beyond loopback it needs Users.
	// Required.
	Listen string
	// Users may log in. When there are any, every request needs one of
	// them, on loopback too.
	Users []User
	// TLS says the listener serves TLS: the session cookie is then Secure,
	// and HTTP basic authentication is accepted.
	TLS bool
	// Logger logs what a request could not do. Defaults to discarding.
	Logger *slog.Logger
	// SessionTTL is how long a login lasts without a request. Defaults to
	// DefaultSessionTTL.
	SessionTTL time.Duration
	// Refresh is how often pages refresh their live parts. Defaults to
	// DefaultRefresh.
	Refresh time.Duration
	// StatsTTL is how long a picture of the system is reused. Defaults to
	// DefaultStatsTTL.
	StatsTTL time.Duration
	// Version is shown at the foot of each page.
	Version string
}

// User is a person who may log in.
type User struct {
	Name     string
	Password string
	// Role says what the user may do. Defaults to RoleOperator.
	Role Role
}

// Role is what a user may do on the dashboard.
type Role string

// The roles of people. The other roles of the config file's auth section
// (worker, scheduler, healthd, auditd, leaf) are for components: they
// cannot log in.
const (
	// RoleOperator may do everything.
	RoleOperator Role = "operator"
	// RoleSubmitter may read everything and start defined work: trigger
	// a job. As on the broker, it writes no task record, so it neither
	// retries, cancels nor purges a task.
	RoleSubmitter Role = "submitter"
	// RoleViewer may read everything and change nothing.
	RoleViewer Role = "viewer"
)

// The actions of the dashboard, as DASHBOARD_ACTION events name them.
const (
	ActionTaskRetry       = "task.retry"
	ActionTaskCancel      = "task.cancel"
	ActionTaskPurge       = "task.purge"
	ActionResourceEnable  = "resource.enable"
	ActionResourceDisable = "resource.disable"
	ActionRouteProbe      = "route.probe"
	ActionJobTrigger      = "job.trigger"
	ActionJobPause        = "job.pause"
	ActionJobResume       = "job.resume"
)

// Allows reports whether role r may take action.
func (r Role) Allows(action string) bool {
	switch r {
	case RoleOperator:
		return true
	case RoleSubmitter:
		return action == ActionJobTrigger
	}
	return false
}

// person reports whether r is a role a person logs in with.
func (r Role) person() bool { return r == RoleOperator || r == RoleSubmitter || r == RoleViewer }

// authMode is how a dashboard lets requests in.
type authMode int

const (
	// modeLocal: on loopback without users; everyone is LocalUser.
	modeLocal authMode = iota
	// modeUsers: every request needs a user.
	modeUsers
	// modeClosed: beyond loopback without users; every request is refused.
	modeClosed
)

// Dashboard serves the dashboard's pages, actions and live streams.
type Dashboard struct {
	lifecycle.Base
	c       *client.Client
	cfg     Config
	log     *slog.Logger
	em      *audit.Emitter
	mode    authMode
	users   map[string]User
	key     []byte
	pages   map[string]*template.Template
	static  http.Handler
	mux     *http.ServeMux
	session *sessions
	// done is closed by Stop: every live stream ends.
	done lifecycle.Stop

	statsMu  sync.Mutex
	stats    client.Stats
	statsAt  time.Time
	statsErr error

	through *throughput
	probes  *probes
}

// New returns a dashboard over c, whose connection it publishes its
// audit events on.
func New(c *client.Client, cfg Config) (*Dashboard, error) {
	if c == nil {
		return nil, errors.New("dashboard: a client is required")
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("dashboard: listen address %q: %w", cfg.Listen, err)
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, DefaultSessionTTL)
	cfg.Refresh = cmp.Or(cfg.Refresh, DefaultRefresh)
	cfg.StatsTTL = cmp.Or(cfg.StatsTTL, DefaultStatsTTL)
	d := &Dashboard{
		c: c, cfg: cfg, log: cfg.Logger,
		users:   map[string]User{},
		key:     make([]byte, 32),
		session: newSessions(cfg.SessionTTL),
		through: newThroughput(),
		probes:  &probes{last: map[string]wire.HealthResult{}},
	}
	js, err := jetstreamOf(c)
	if err != nil {
		return nil, err
	}
	d.em = audit.NewEmitter(js, "dashboard", nil)
	_, _ = rand.Read(d.key)
	for _, u := range cfg.Users {
		u.Role = cmp.Or(u.Role, RoleOperator)
		if u.Name == "" || u.Password == "" {
			continue
		}
		d.users[u.Name] = u
	}
	switch {
	case len(d.users) > 0:
		d.mode = modeUsers
	case isLoopback(host):
		d.mode = modeLocal
	default:
		d.mode = modeClosed
	}
	if d.pages, err = parsePages(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(webFS, "web/static")
	if err != nil {
		return nil, fmt.Errorf("dashboard: assets: %w", err)
	}
	d.static = http.StripPrefix("/static/", http.FileServerFS(static))
	d.routes()
	return d, nil
}

// Insecure reports whether the dashboard refuses every request because it
// listens beyond loopback without users (ErrInsecure).
func (d *Dashboard) Insecure() bool { return d.mode == modeClosed }

// Run follows the finished tasks and the route probes until Stop or the
// end of ctx. It returns nil on a clean stop.
func (d *Dashboard) Run(ctx context.Context) error {
	return lifecycle.Run(ctx, &d.Base, func(ctx context.Context, r *lifecycle.Runner) error {
		sub, err := d.c.Conn().Subscribe(wire.SubjectHealthAll, d.probes.record)
		if err != nil {
			return fmt.Errorf("dashboard: follow route probes: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		stop := r.StopContext()
		r.Go(func() { d.through.follow(stop, d.c, d.log) })
		r.MarkReady()
		<-stop.Done()
		return nil
	})
}

// Stop ends Run and every live stream the dashboard serves. It is
// idempotent and safe before Run.
func (d *Dashboard) Stop() {
	d.done.Stop()
	d.Base.Stop()
}

// ServeHTTP serves the dashboard.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; form-action 'self'")
	if r.URL.Path == "/favicon.ico" {
		r = r.Clone(r.Context())
		r.URL.Path = "/static/favicon.svg"
	}
	if strings.HasPrefix(r.URL.Path, "/static/") {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		d.static.ServeHTTP(w, r)
		return
	}
	d.authenticate(d.mux).ServeHTTP(w, r)
}

func (d *Dashboard) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", d.overview)
	m.HandleFunc("GET /tasks", d.taskList)
	m.HandleFunc("GET /tasks/{id}", d.taskPage)
	m.HandleFunc("GET /tasks/{id}/output", d.taskOutput)
	m.HandleFunc("POST /tasks/{id}/{action}", d.taskAction)
	m.HandleFunc("GET /resources", d.resourceList)
	m.HandleFunc("GET /resources/{id}", d.resourcePage)
	m.HandleFunc("POST /resources/{id}/{action}", d.resourceAction)
	m.HandleFunc("GET /routes", d.routeList)
	m.HandleFunc("POST /routes/{id}/probe", d.routeProbe)
	m.HandleFunc("GET /jobs", d.jobList)
	m.HandleFunc("GET /jobs/{name}", d.jobPage)
	m.HandleFunc("POST /jobs/{name}/{action}", d.jobAction)
	m.HandleFunc("GET /audit", d.auditPage)
	m.HandleFunc("GET /audit/live", d.auditLive)
	m.HandleFunc("GET /login", d.loginPage)
	m.HandleFunc("POST /login", d.login)
	m.HandleFunc("POST /logout", d.logout)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d.fail(w, r, http.StatusNotFound, fmt.Errorf("no page %s", r.URL.Path))
	})
	d.mux = m
}

// view is what every page template gets.
type view struct {
	Title   string
	Nav     string
	User    *principal
	Flash   *flash
	Refresh int64
	Version string
	Now     time.Time
	Data    any
}

// render executes page with data, inside the layout.
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, status int, page, title string, data any) {
	t, ok := d.pages[page]
	if !ok {
		http.Error(w, "no template "+page, http.StatusInternalServerError)
		return
	}
	p := principalOf(r)
	v := view{Title: title, Nav: page, User: p, Refresh: d.cfg.Refresh.Milliseconds(), Version: d.cfg.Version, Now: time.Now(), Data: data}
	if p != nil && p.sess != nil {
		v.Flash = d.session.takeFlash(p.sess)
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		d.log.Warn("dashboard page not rendered", "page", page, "err", err)
		http.Error(w, "page not rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail renders an error page.
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	d.render(w, r, status, "error", http.StatusText(status), map[string]any{"Status": status, "Error": err.Error()})
}

// errStatus maps a client error to an HTTP status.
func errStatus(err error) int {
	switch {
	case errors.Is(err, client.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, client.ErrInvalid), errors.Is(err, client.ErrIllegalMove):
		return http.StatusBadRequest
	case errors.Is(err, client.ErrConflict), errors.Is(err, client.ErrChanged):
		return http.StatusConflict
	case errors.Is(err, client.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// statsNow returns a picture of the system no older than StatsTTL, shared
// by every page that shows one.
func (d *Dashboard) statsNow(ctx context.Context) (client.Stats, error) {
	d.statsMu.Lock()
	defer d.statsMu.Unlock()
	if time.Since(d.statsAt) < d.cfg.StatsTTL {
		return d.stats, d.statsErr
	}
	d.stats, d.statsErr = d.c.Stats(ctx)
	d.statsAt = time.Now()
	return d.stats, d.statsErr
}

// isLoopback reports whether host names this machine's loopback.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
