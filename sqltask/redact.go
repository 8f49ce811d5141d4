package sqltask

import (
	"cmp"
	"net/url"
	"slices"
	"strings"

	"github.com/gantry-dev/gantry/broker/wire"
)

// minSecret is the shortest DSN or password scrubbed from error text: a
// shorter one would blank out ordinary letters of the message.
const minSecret = 3

// secretsOf lists what an error about a database must never show: its DSN
// and its password, as written and escaped as a URL or query would hold
// them. The longest come first, so that a DSN is scrubbed whole before the
// password inside it.
func secretsOf(dsn, password string) []string {
	var out []string
	if len(dsn) >= minSecret {
		out = append(out, dsn)
	}
	if len(password) >= minSecret {
		out = append(out, password, url.QueryEscape(password), url.PathEscape(password),
			strings.TrimPrefix(url.UserPassword("", password).String(), ":"))
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Or(cmp.Compare(len(b), len(a)), strings.Compare(a, b)) })
	return slices.Compact(out)
}

// scrub replaces every secret in s with wire.Redacted.
func scrub(s string, secrets []string) string {
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, wire.Redacted)
		}
	}
	return s
}
