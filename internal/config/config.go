// Package config reads gantry's YAML config file. Every section is optional;
// an unknown key is an error that names it.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// ErrInvalid marks every error about the config file's content; the CLI maps
// it to exit code 2.
var ErrInvalid = kv.Sentinel("invalid config", kv.ErrInvalid)

// File is the whole config file.
type File struct {
	// Auth configures the users the broker accepts; needed to listen beyond
	// loopback.
	Auth Auth `yaml:"auth"`
	// Broker configures the embedded broker's cluster and leaf links; the
	// flags of 'gantry broker' and 'gantry run' override it.
	Broker Broker `yaml:"broker"`
	// TLS configures the certificates of the listeners.
	TLS TLSSettings `yaml:"tls"`
	// Routes are the egress routes healthd probes.
	Routes []Route `yaml:"routes"`
	// Resources are registered in gantry_resources at start.
	Resources []Resource `yaml:"resources"`
	// Databases are what sql tasks connect to.
	Databases []Database `yaml:"databases"`
	// Jobs are applied to gantry_jobs at start.
	Jobs []Job `yaml:"jobs"`
	// Workers configures the workers of 'gantry run'.
	Workers Workers `yaml:"workers"`
	// Alerts configures alertd: its rules and sinks.
	Alerts Alerts `yaml:"alerts"`
}

// Workers configures the workers 'gantry run' starts; 'gantry worker' takes
// the same settings as flags.
type Workers struct {
	// TaskRetention is how long the record of a task that ended SUCCEEDED
	// or CANCELLED stays in gantry_tasks after its last write, in whole
	// seconds ("36h", "30d"); 0 keeps every record. Defaults to 7d.
	TaskRetention *Retention `yaml:"task_retention"`
}

// Auth lists the broker's users, or the operator whose creds files (JWTs)
// it accepts instead.
type Auth struct {
	Users []User `yaml:"users"`
	// Operator runs the broker in NATS operator mode: users are creds
	// files minted with 'gantry role creds'.
	Operator *Operator `yaml:"operator"`
}

// Operator is a NATS operator-mode set-up (files made with nsc or
// otherwise).
type Operator struct {
	// JWT is the operator's JWT file.
	JWT string `yaml:"jwt"`
	// Account is the JWT file of the account gantry's users belong to,
	// with JetStream enabled.
	Account string `yaml:"account"`
	// AccountSeed is the account's seed file: the broker signs its
	// in-process user with it.
	AccountSeed string `yaml:"account_seed"`
	// SystemAccount is the JWT file of the operator's system account.
	SystemAccount string `yaml:"system_account"`
}

// Configured reports whether the broker authenticates its clients.
func (a Auth) Configured() bool { return len(a.Users) > 0 || a.Operator != nil }

// User is one broker user: a user name and password, or an NKey's public
// key, with the role that says what it may do (docs/deployment.md).
type User struct {
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// NKey is the user's public NKey (U...); the client signs with its
	// seed ('gantry --nkey FILE').
	NKey string `yaml:"nkey"`
	// Role is operator, worker, scheduler, healthd, auditd, submitter,
	// viewer or leaf. Defaults to operator.
	Role string `yaml:"role"`
}

// Broker configures the embedded broker beyond its listen address.
type Broker struct {
	// Name names this server among a cluster's. Defaults to gantry-<port>.
	Name string `yaml:"name"`
	// Cluster is the host:port the other members' routes connect to;
	// setting it makes this broker a cluster member.
	Cluster string `yaml:"cluster"`
	// ClusterName names the cluster. Defaults to gantry.
	ClusterName string `yaml:"cluster_name"`
	// Routes are the members' cluster URLs (nats-route://host:port).
	Routes []string `yaml:"routes"`
	// Replicas of every stream and bucket. Defaults to 3 once the cluster
	// has three servers, else 1.
	Replicas int `yaml:"replicas"`
	// Domain is this broker's JetStream domain. Defaults to none; a leaf
	// broker's defaults to its host name.
	Domain string `yaml:"domain"`
	// Leaf is the hub's leafnode URL (nats-leaf://[user:pass@]host:port),
	// or several comma separated: this broker attaches to it as a leaf.
	Leaf string `yaml:"leaf"`
	// LeafCredentials is the creds file of the link to the hub.
	LeafCredentials string `yaml:"leaf_credentials"`
	// LeafListen is the host:port leaf brokers attach to (on a hub).
	LeafListen string `yaml:"leaf_listen"`
	// LeafDomains are the domains of the leaf brokers whose audit events
	// this hub's GANTRY_AUDIT sources (on a hub).
	LeafDomains []string `yaml:"leaf_domains"`
}

// TLSSettings holds the certificates of each listener.
type TLSSettings struct {
	// Client secures the NATS client listener.
	Client *TLS `yaml:"client"`
	// Cluster secures the routes between cluster members, verifying both
	// sides against CA.
	Cluster *TLS `yaml:"cluster"`
	// Leaf secures the leafnode listener (on a hub).
	Leaf *TLS `yaml:"leaf"`
	// LeafRemote is the CA (and client certificate) of the link to the
	// hub (on a leaf).
	LeafRemote *TLS `yaml:"leaf_remote"`
	// HTTP secures /healthz, /readyz and what else HTTP serves.
	HTTP *TLS `yaml:"http"`
}

// TLS is one listener's certificate (PEM files).
type TLS struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// CA verifies the peers' certificates.
	CA string `yaml:"ca"`
	// Verify requires clients to present a certificate signed by CA.
	Verify bool `yaml:"verify"`
}

// Route is an egress route healthd probes and http tasks go out through
// (see route.go for its validation).
type Route struct {
	// ID names the route: letters, digits, '-' and '_'.
	ID string `yaml:"id"`
	// Proxy is an http:// (HTTP CONNECT) or socks5:// URL, credentials
	// allowed, or "direct". Defaults to direct.
	Proxy string `yaml:"proxy"`
	// ProbeURL is fetched through the route by every probe. Required.
	ProbeURL string `yaml:"probe_url"`
	// Interval is the time between probes. Defaults to 30s.
	Interval Duration `yaml:"interval"`
	// ExpectIP and ExpectRegion are checked against what ExpectURL reports:
	// a JSON object with "ip" (or "origin", "query") and "region" (or
	// "country", "country_code"), or a plain-text IP.
	ExpectIP     string `yaml:"expect_ip"`
	ExpectRegion string `yaml:"expect_region"`
	ExpectURL    string `yaml:"expect_url"`
}

// Resource is a resource to register.
type Resource struct {
	// ID names the resource: letters, digits, '-', '_', '/' or '='.
	ID    string `yaml:"id"`
	Route string `yaml:"route"`
	// Reclaim is where the resource goes when it is found RUNNING with its
	// holder's lease gone: available or fault. Defaults to available.
	Reclaim string `yaml:"reclaim"`
}

// Roles are the roles a user may have; broker.Roles defines what each
// allows.
var Roles = []string{"operator", "worker", "scheduler", "healthd", "auditd", "alertd", "submitter", "viewer", "leaf"}

// resourceID is what a resource id may hold: it is a KV key.
var resourceID = regexp.MustCompile(`^[-/_=A-Za-z0-9]+$`)

// Database is a database sql tasks may use (see database.go and
// docs/sql.md). Exactly one of DSN, DSNEnv and DSNFile gives its data
// source name.
type Database struct {
	// Name is what a sql task's payload names in db: letters, digits, '-'
	// and '_'.
	Name string `yaml:"name"`
	// Driver is sqlite, postgres, sqlserver or mysql.
	Driver string `yaml:"driver"`
	// DSN is the data source name as written in this file: fine for a
	// SQLite file, but a password here is readable by anyone who can read
	// the file.
	DSN string `yaml:"dsn"`
	// DSNEnv names an environment variable holding the DSN.
	DSNEnv string `yaml:"dsn_env"`
	// DSNFile names a file holding the DSN (surrounding whitespace is
	// trimmed); a relative path is relative to this config file.
	DSNFile string `yaml:"dsn_file"`
	// MaxOpen bounds the connections of each worker's pool for it.
	// Defaults to 4.
	MaxOpen int `yaml:"max_open"`
}

// Job is a scheduled job as the config file writes it. Definition turns it
// into the one job definition, wire.Job, which jobs.Validate checks: the
// config file, 'gantry job add' and any client are held to the same rules.
// Durations are Go duration strings ("30s").
type Job struct {
	// Name is the job's key in gantry_jobs: letters, digits, '-' and '_'.
	Name string `yaml:"name"`
	// Type and Queue pick the task subject gantry.tasks.<queue>.<type>.
	// Queue defaults to default.
	Type  string `yaml:"type"`
	Queue string `yaml:"queue"`
	// Payload, Priority, Timeout, MaxAttempts and Resource go into every
	// task the job fires.
	Payload map[string]any `yaml:"payload"`
	// Exactly one of Cron (5 fields, or 6 with seconds), Every and At
	// (RFC 3339, or "2006-01-02 15:04" in Timezone) is set.
	Cron  string `yaml:"cron"`
	Every string `yaml:"every"`
	At    string `yaml:"at"`
	// Timezone (IANA) is what Cron, At and the windows are read in.
	// Defaults to UTC.
	Timezone string `yaml:"timezone"`
	// Window and Windows ("HH:MM-HH:MM") are the allowed times of day.
	// Defaults to always.
	Window  string   `yaml:"window"`
	Windows []string `yaml:"windows"`
	// Jitter delays each fire by up to this much. Defaults to none.
	Jitter string `yaml:"jitter"`
	// Misfire is skip, once or all. Defaults to once. MisfireCap bounds
	// "all". Defaults to 100.
	Misfire    string `yaml:"misfire"`
	MisfireCap int    `yaml:"misfire_cap"`
	// Overlap is allow, forbid or replace. Defaults to allow.
	Overlap string `yaml:"overlap"`
	// MaxPerHour caps the fires in any hour. Defaults to no cap.
	MaxPerHour  int    `yaml:"max_per_hour"`
	Priority    int    `yaml:"priority"`
	Timeout     string `yaml:"timeout"`
	MaxAttempts int    `yaml:"max_attempts"`
	Resource    string `yaml:"resource"`
	// Cooldown keeps jobs on Resource from firing until this long after a
	// run on it finished. Defaults to none.
	Cooldown    string `yaml:"cooldown"`
	Description string `yaml:"description"`
	// Paused applies when the job is created; afterwards 'gantry job
	// pause|resume' decides.
	Paused bool `yaml:"paused"`
}

// Duration is a time.Duration written as a Go duration string ("30s").
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration such as 30s or 5m", n.Line)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (want e.g. 30s or 5m)", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// Retention is a retention period written as a Go duration ("36h") or as
// whole days ("30d"); 0 means keep forever.
type Retention time.Duration

// UnmarshalYAML parses a retention with ParseRetention.
func (r *Retention) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration such as 36h or 30d", n.Line)
	}
	d, err := ParseRetention(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*r = Retention(d)
	return nil
}

// ParseRetention reads a retention period: a Go duration ("36h") or whole
// days ("30d"), 0 or more.
func ParseRetention(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseUint(days, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%q: want a Go duration (36h) or whole days (30d)", s)
		}
		// More days than a Duration holds would wrap around into another
		// retention (217000d read as 3496 days).
		if n > uint64(math.MaxInt64/int64(24*time.Hour)) {
			return 0, fmt.Errorf("%q: want at most %dd", s, math.MaxInt64/int64(24*time.Hour))
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("%q: want a Go duration (36h) or whole days (30d)", s)
		}
	}
	if d < 0 {
		return 0, fmt.Errorf("%q: want a duration of 0 or more", s)
	}
	return d, nil
}

// Load reads and validates the config file at path.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	for i, d := range f.Databases {
		if d.DSNFile != "" && !filepath.IsAbs(d.DSNFile) {
			f.Databases[i].DSNFile = filepath.Join(filepath.Dir(path), d.DSNFile)
		}
	}
	f.Alerts.relativeTo(filepath.Dir(path))
	return f, nil
}

var unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type [\w.]+`)

// Parse decodes and validates a config document.
func Parse(data []byte) (*File, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		msg := unknownField.ReplaceAllString(err.Error(), `line $1: unknown key "$2"`)
		return nil, fmt.Errorf("%w: %s", ErrInvalid, msg)
	}
	if err := f.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return &f, nil
}

func (f *File) validate() error {
	if err := f.Alerts.validate(); err != nil {
		return err
	}
	for i, u := range f.Auth.Users {
		if (u.User == "" || u.Password == "") && u.NKey == "" {
			return fmt.Errorf("auth.users[%d]: needs user and password, or nkey", i)
		}
		if u.Role != "" && !slices.Contains(Roles, u.Role) {
			return fmt.Errorf("auth.users[%d]: role %q: want one of %s", i, u.Role, strings.Join(Roles, ", "))
		}
	}
	if o := f.Auth.Operator; o != nil {
		if len(f.Auth.Users) > 0 {
			return errors.New("auth: users or operator, not both (in operator mode users are creds files)")
		}
		if o.JWT == "" || o.Account == "" || o.AccountSeed == "" || o.SystemAccount == "" {
			return errors.New("auth.operator: needs jwt, account, account_seed and system_account")
		}
	}
	for name, t := range map[string]*TLS{"client": f.TLS.Client, "cluster": f.TLS.Cluster, "leaf": f.TLS.Leaf, "http": f.TLS.HTTP} {
		if t != nil && (t.Cert == "" || t.Key == "") {
			return fmt.Errorf("tls.%s: needs cert and key", name)
		}
	}
	if f.Broker.Replicas < 0 {
		return fmt.Errorf("broker.replicas %d: want 0 (automatic) or more", f.Broker.Replicas)
	}
	routes := map[string]bool{}
	for i, r := range f.Routes {
		if !wire.ValidToken(r.ID) {
			return fmt.Errorf("routes[%d]: id %q must be non-empty, without spaces, '.', '*' or '>'", i, r.ID)
		}
		if routes[r.ID] {
			return fmt.Errorf("routes[%d]: duplicate id %q", i, r.ID)
		}
		routes[r.ID] = true
		if err := r.validate(i); err != nil {
			return err
		}
	}
	seen := map[string]bool{}
	for i, r := range f.Resources {
		if !wire.ValidToken(r.ID) {
			return fmt.Errorf("resources[%d]: id %q must be non-empty, without spaces, '.', '*' or '>'", i, r.ID)
		}
		if seen[r.ID] {
			return fmt.Errorf("resources[%d]: duplicate id %q", i, r.ID)
		}
		seen[r.ID] = true
		if r.Route != "" && !routes[r.Route] {
			return fmt.Errorf("resources[%d]: route %q is not among routes", i, r.Route)
		}
		if !resourceID.MatchString(r.ID) {
			return fmt.Errorf("resources[%d]: id %q may hold only letters, digits, '-', '_', '/' and '='", i, r.ID)
		}
		if r.Reclaim != "" && r.Reclaim != "available" && r.Reclaim != "fault" {
			return fmt.Errorf("resources[%d] (%s): reclaim %q: want available or fault", i, r.ID, r.Reclaim)
		}
	}
	dbs := map[string]bool{}
	for i, d := range f.Databases {
		if dbs[d.Name] {
			return fmt.Errorf("databases[%d]: duplicate name %q", i, d.Name)
		}
		dbs[d.Name] = true
		if err := d.validate(i); err != nil {
			return err
		}
	}
	names := map[string]bool{}
	for i, j := range f.Jobs {
		if names[j.Name] {
			return fmt.Errorf("jobs[%d]: duplicate name %q", i, j.Name)
		}
		names[j.Name] = true
		if _, err := j.Definition(); err != nil {
			return fmt.Errorf("jobs[%d]: %w", i, err)
		}
	}
	// The broker's per-message TTL is whole seconds, at least 1 s.
	if r := f.Workers.TaskRetention; r != nil && *r != 0 && (*r < Retention(time.Second) || *r%Retention(time.Second) != 0) {
		return fmt.Errorf("workers.task_retention %v: want whole seconds, at least 1s, or 0 to keep every record", time.Duration(*r))
	}
	return nil
}
