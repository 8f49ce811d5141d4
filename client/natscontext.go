package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// natsContext is the part of a nats CLI context file gantry reads (the
// file's other settings are left alone).
type natsContext struct {
	URL      string `json:"url"`
	User     string `json:"user"`
	Password string `json:"password"`
	Token    string `json:"token"`
	Creds    string `json:"creds"`
	NKey     string `json:"nkey"`
	Cert     string `json:"cert"`
	Key      string `json:"key"`
	CA       string `json:"ca"`
	NSC      string `json:"nsc"`
}

// ContextDir is where the nats CLI keeps its contexts: nats/ under
// $XDG_CONFIG_HOME, or under ~/.config.
func ContextDir() (string, error) {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "nats"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("nats context: %w", err)
	}
	return filepath.Join(home, ".config", "nats"), nil
}

// SelectedContext returns the name of the context the nats CLI has
// selected ('nats context select': the file context.txt), or "" when none
// is.
func SelectedContext() (string, error) {
	dir, err := ContextDir()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(dir, "context.txt"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("nats context: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// LoadContext reads the nats CLI's context name (context/NAME.json under
// ContextDir, as 'nats context add' writes it) into Options: its url,
// user and password, token, creds, cert, key and ca, with ~ and
// environment variables in the paths expanded. A context that needs nsc
// or an nkey seed, which gantry does not read, is an error saying so.
func LoadContext(name string) (Options, error) {
	if name == "" || strings.Contains(name, "..") || strings.ContainsAny(name, `/\`) {
		return Options{}, fmt.Errorf("%w: nats context name %q", ErrInvalid, name)
	}
	dir, err := ContextDir()
	if err != nil {
		return Options{}, err
	}
	path := filepath.Join(dir, "context", name+".json")
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Options{}, fmt.Errorf("%w: unknown nats context %q (no %s; 'nats context ls' lists them)", ErrNotFound, name, path)
	}
	if err != nil {
		return Options{}, fmt.Errorf("nats context %s: %w", name, err)
	}
	var c natsContext
	if err := json.Unmarshal(data, &c); err != nil {
		return Options{}, fmt.Errorf("%w: nats context %s: %v", ErrInvalid, path, err)
	}
	if c.NSC != "" || c.NKey != "" {
		return Options{}, fmt.Errorf("%w: nats context %s uses nsc or an nkey, which gantry does not read: give it a creds file", ErrInvalid, name)
	}
	return Options{
		Servers: c.URL, User: c.User, Password: c.Password, Token: c.Token,
		Creds: expandPath(c.Creds), TLSCert: expandPath(c.Cert), TLSKey: expandPath(c.Key), TLSCA: expandPath(c.CA),
	}, nil
}

// expandPath expands environment variables and a leading ~ in a path, as
// the nats CLI does.
func expandPath(p string) string {
	p = os.ExpandEnv(p)
	if rest, ok := strings.CutPrefix(p, "~"); ok && (rest == "" || rest[0] == '/' || rest[0] == filepath.Separator) {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}
