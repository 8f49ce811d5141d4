package main

import (
	"encoding/json"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// sqlFlags are the flags 'gantry submit sql' builds its payload from.
type sqlFlags struct {
	db, statement string
	args          []string
}

func (f *sqlFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.db, "db", "", "sql: the database, a name from the config file's databases")
	fl.StringVar(&f.statement, "statement", "", "sql: the statement, or @FILE holding it")
	fl.StringArrayVar(&f.args, "arg", nil, `sql: the next positional argument, bound as a parameter: JSON (42, true, null, "text") or else plain text (repeatable)`)
}

// apply sets db, statement and args of a sql task's payload from the flags,
// over those of --payload. Without the flags, payload is returned as is.
func (f *sqlFlags) apply(typ string, payload json.RawMessage) (json.RawMessage, error) {
	if f.db == "" && f.statement == "" && f.args == nil {
		return payload, nil
	}
	if typ != "sql" {
		return nil, usageError("--db, --statement and --arg are for sql tasks, not %s", typ)
	}
	fields := map[string]any{}
	if len(payload) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(payload, &obj); err != nil {
			return nil, usageError("--payload: want a JSON object to add --db, --statement or --arg to")
		}
		for k, v := range obj {
			fields[k] = v
		}
	}
	if f.db != "" {
		fields["db"] = f.db
	}
	if f.statement != "" {
		stmt := f.statement
		if path, ok := strings.CutPrefix(stmt, "@"); ok {
			data, err := os.ReadFile(path)
			if err != nil {
				return nil, usageError("--statement: %v", err)
			}
			stmt = string(data)
		}
		fields["statement"] = stmt
	}
	if f.args != nil {
		args := make([]json.RawMessage, len(f.args))
		for i, a := range f.args {
			if json.Valid([]byte(a)) {
				args[i] = json.RawMessage(a)
				continue
			}
			args[i], _ = json.Marshal(a)
		}
		fields["args"] = args
	}
	data, err := json.Marshal(fields)
	if err != nil {
		return nil, usageError("sql payload: %v", err)
	}
	return data, nil
}
