package sqltask

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	mssql "github.com/microsoft/go-mssqldb"

	"github.com/gantry-dev/gantry/broker/wire"
)

// statement is a payload made ready to run.
type statement struct {
	text string
	args []any
	// query: run for its rows, not its rows affected.
	query   bool
	tx      bool
	timeout time.Duration
	maxRows int
	// outs are the output parameters (SQL Server); status receives the
	// return status of a procedure.
	outs   []output
	status *mssql.ReturnStatus
}

// output is one output parameter and where its value lands.
type output struct {
	name string
	dest any
}

// prepare checks p and binds its arguments for drv. Its errors are
// permanent.
func prepare(drv string, p wire.SQLPayload) (statement, error) {
	st := statement{text: p.Statement, tx: p.Tx, maxRows: p.MaxRows}
	if strings.TrimSpace(p.Statement) == "" {
		return st, invalidf("sql payload: statement is empty")
	}
	if p.MaxRows < 0 {
		return st, invalidf("sql payload: max_rows %d: want 0 (the default, %d) or more", p.MaxRows, DefaultMaxRows)
	}
	if st.maxRows == 0 {
		st.maxRows = DefaultMaxRows
	}
	if p.Timeout != "" {
		d, err := time.ParseDuration(p.Timeout)
		if err != nil || d <= 0 {
			return st, invalidf("sql payload: timeout %q: want a positive Go duration such as 30s", p.Timeout)
		}
		st.timeout = d
	}
	positional, named, err := decodeArgs(p.Args)
	if err != nil {
		return st, err
	}
	if len(p.Out) > 0 && drv != SQLServer {
		return st, invalidf("sql payload: out parameters are a SQL Server feature; on %s, return values with SELECT, RETURNING or CALL", drv)
	}
	if len(p.Out) > 0 && positional != nil {
		return st, invalidf("sql payload: out parameters need named args (an object), not an array")
	}
	if named != nil || len(p.Out) > 0 {
		if st.args, st.outs, err = bindNamed(drv, named, p.Out); err != nil {
			return st, err
		}
	} else {
		st.args = positional
	}
	st.query = returnsRows(drv, p.Statement)
	if drv == SQLServer && isProcedure(p.Statement) {
		// A bare name is called as a procedure (an RPC), whose return
		// status the server sends.
		st.text = strings.TrimSpace(st.text)
		st.status = new(mssql.ReturnStatus)
		st.args = append(st.args, st.status)
		st.query = true
	}
	return st, nil
}

// isProcedure reports whether a SQL Server statement is a procedure's bare
// name, which go-mssqldb calls as a procedure.
func isProcedure(stmt string) bool {
	stmt = strings.TrimSpace(stmt)
	return stmt != "" && !strings.ContainsAny(stmt, " \t\r\n;'()=,")
}

// decodeArgs reads a payload's args: a JSON array (positional), an object
// (named) or nothing.
func decodeArgs(raw json.RawMessage) (positional []any, named map[string]any, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, nil, invalidf("sql payload: args: %v", err)
	}
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, a := range x {
			if out[i], err = argValue(a); err != nil {
				return nil, nil, invalidf("sql payload: args[%d]: %v", i, err)
			}
		}
		return out, nil, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, a := range x {
			if !validName(k) {
				return nil, nil, invalidf("sql payload: args: name %q: want a letter, then letters, digits and '_'", k)
			}
			if out[k], err = argValue(a); err != nil {
				return nil, nil, invalidf("sql payload: args[%q]: %v", k, err)
			}
		}
		return nil, out, nil
	}
	return nil, nil, invalidf("sql payload: args: want an array (positional) or an object (named)")
}

// argValue turns a decoded JSON value into what a driver binds: an integer
// is an int64, another number a float64; an array or object is its JSON
// text (for json columns).
func argValue(v any) (any, error) {
	switch x := v.(type) {
	case nil, string, bool:
		return x, nil
	case json.Number:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return n, nil
		}
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return nil, fmt.Errorf("number %s out of range", x)
		}
		return f, nil
	default:
		data, err := json.Marshal(x)
		if err != nil {
			return nil, err
		}
		return string(data), nil
	}
}

// bindNamed binds named args for drv, and the output parameters outs
// last.
func bindNamed(drv string, named map[string]any, outs []string) ([]any, []output, error) {
	switch drv {
	case MySQL:
		return nil, nil, invalidf("sql payload: the mysql driver has no named parameters: use ? placeholders and an args array")
	case Postgres:
		// pgx rewrites @name placeholders itself.
		return []any{pgx.NamedArgs(named)}, nil, nil
	}
	names := make([]string, 0, len(named))
	for k := range named {
		if !slices.Contains(outs, k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	args := make([]any, 0, len(names)+len(outs))
	for _, k := range names {
		args = append(args, sql.Named(k, named[k]))
	}
	var out []output
	for _, k := range outs {
		if !validName(k) {
			return nil, nil, invalidf("sql payload: out %q: want a letter, then letters, digits and '_'", k)
		}
		dest := outDest(named[k])
		args = append(args, sql.Named(k, sql.Out{Dest: dest}))
		out = append(out, output{name: k, dest: dest})
	}
	return args, out, nil
}

// outDest is where an output parameter lands: a pointer to a value of the
// initial value's type (an int64, a float64, a bool or a string), which
// gives the parameter's type.
func outDest(initial any) any {
	switch x := initial.(type) {
	case int64:
		return &x
	case float64:
		return &x
	case bool:
		return &x
	case string:
		return &x
	}
	s := ""
	return &s
}

// validName reports whether s can name a parameter: a letter, then
// letters, digits and '_' (database/sql's rule, and every driver's).
func validName(s string) bool {
	for i, c := range s {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c == '_' || c >= '0' && c <= '9')) {
			return false
		}
	}
	return s != ""
}

// outputs puts the output parameters and the return status into res.
func (st statement) outputs(res *wire.SQLResult) {
	for _, o := range st.outs {
		if res.Out == nil {
			res.Out = map[string]any{}
		}
		switch d := o.dest.(type) {
		case *int64:
			res.Out[o.name] = *d
		case *float64:
			res.Out[o.name] = number(*d)
		case *bool:
			res.Out[o.name] = *d
		case *string:
			res.Out[o.name] = *d
		}
	}
	if st.status != nil {
		n := int64(*st.status)
		res.ReturnStatus = &n
	}
}

// The first keywords of statements run for their effect: rows affected,
// not rows.
var execKeywords = map[string]bool{
	"INSERT": true, "UPDATE": true, "DELETE": true, "MERGE": true, "REPLACE": true, "UPSERT": true,
	"CREATE": true, "ALTER": true, "DROP": true, "TRUNCATE": true, "RENAME": true,
	"GRANT": true, "REVOKE": true, "COMMENT": true,
}

// returnsRows reports whether a statement is run as a query (its first
// result set kept) rather than for its effect (rows affected): all are but
// INSERT, UPDATE, DELETE, MERGE, REPLACE and DDL without a RETURNING (or,
// on SQL Server, OUTPUT) clause.
func returnsRows(drv, stmt string) bool {
	words := keywords(stmt)
	if len(words) == 0 {
		return false
	}
	if !execKeywords[words[0]] {
		return true
	}
	return slices.Contains(words, "RETURNING") || (drv == SQLServer && slices.Contains(words, "OUTPUT"))
}

// keywords returns the bare words of stmt, upper-cased, skipping comments,
// string literals, quoted identifiers and dollar-quoted bodies.
func keywords(stmt string) []string {
	var words []string
	s := stmt
	for len(s) > 0 {
		c := s[0]
		switch {
		case strings.HasPrefix(s, "--"):
			s = skipPast(s[2:], "\n")
		case strings.HasPrefix(s, "/*"):
			s = skipPast(s[2:], "*/")
		case c == '\'' || c == '"' || c == '`':
			s = skipQuoted(s[1:], c)
		case c == '[':
			s = skipPast(s[1:], "]")
		case c == '$':
			if tag, ok := dollarTag(s); ok {
				s = skipPast(s[len(tag):], tag)
			} else {
				s = s[1:]
			}
		case isWordStart(c):
			i := 1
			for i < len(s) && (isWordStart(s[i]) || s[i] >= '0' && s[i] <= '9' || s[i] == '$') {
				i++
			}
			words = append(words, strings.ToUpper(s[:i]))
			s = s[i:]
		default:
			s = s[1:]
		}
	}
	return words
}

func isWordStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// skipPast returns s after the first end, or "" if there is none.
func skipPast(s, end string) string {
	if i := strings.Index(s, end); i >= 0 {
		return s[i+len(end):]
	}
	return ""
}

// skipQuoted returns s after the closing quote q; a doubled quote is part
// of the literal.
func skipQuoted(s string, q byte) string {
	for i := 0; i < len(s); i++ {
		if s[i] != q {
			continue
		}
		if i+1 < len(s) && s[i+1] == q {
			i++
			continue
		}
		return s[i+1:]
	}
	return ""
}

// dollarTag returns the PostgreSQL dollar-quote tag ($$ or $tag$) s starts
// with.
func dollarTag(s string) (string, bool) {
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '$':
			return s[:i+1], true
		case !isWordStart(c) && !(i > 1 && c >= '0' && c <= '9'):
			return "", false
		}
	}
	return "", false
}
