package sqltask

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	mssql "github.com/microsoft/go-mssqldb"

	"github.com/gantry-dev/gantry/broker/wire"
)

// maxCell bounds one text value of a result; a longer one is cut and the
// result marked truncated.
const maxCell = 4 << 10

// query runs a statement for its rows: it keeps the first result set that
// has columns, up to st.maxRows rows and MaxResultBytes.
func query(ctx context.Context, on conn, st statement) (wire.SQLResult, error) {
	var res wire.SQLResult
	rows, err := on.QueryContext(ctx, st.text, st.args...)
	if err != nil {
		return res, err
	}
	defer rows.Close()
	cols, err := rows.ColumnTypes()
	if err != nil {
		return res, err
	}
	// A procedure may send results without columns (row counts) before
	// its first result set.
	for len(cols) == 0 && rows.NextResultSet() {
		if cols, err = rows.ColumnTypes(); err != nil {
			return res, err
		}
	}
	if len(cols) > 0 {
		res.Columns = make([]string, len(cols))
		for i, c := range cols {
			res.Columns[i] = c.Name()
		}
	}
	size := 0
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for len(cols) > 0 && rows.Next() {
		if len(res.Rows) == st.maxRows {
			res.Truncated = true
			break
		}
		if err := rows.Scan(ptrs...); err != nil {
			return res, err
		}
		row := make([]any, len(vals))
		for i, v := range vals {
			var cut bool
			row[i], cut = cell(v, cols[i].DatabaseTypeName())
			res.Truncated = res.Truncated || cut
		}
		enc, err := json.Marshal(row)
		if err != nil {
			return res, err
		}
		if size += len(enc) + 1; size > MaxResultBytes {
			res.Truncated = true
			break
		}
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Close(); err != nil {
		return res, err
	}
	return res, rows.Err()
}

// cell turns a value a driver scanned into one JSON can hold, and reports
// whether it was cut to maxCell.
func cell(v any, dbType string) (any, bool) {
	switch x := v.(type) {
	case []byte:
		switch dbType {
		case "UNIQUEIDENTIFIER":
			var u mssql.UniqueIdentifier
			if u.Scan(x) == nil {
				return u.String(), false
			}
		case "JSON", "JSONB":
			if json.Valid(x) && len(x) <= maxCell {
				return json.RawMessage(x), false
			}
		}
		if utf8.Valid(x) {
			return text(string(x))
		}
		return text(base64.StdEncoding.EncodeToString(x))
	case string:
		if (dbType == "JSON" || dbType == "JSONB") && json.Valid([]byte(x)) && len(x) <= maxCell {
			return json.RawMessage(x), false
		}
		return text(x)
	case time.Time:
		return x.Format(time.RFC3339Nano), false
	case float64:
		return number(x), false
	case float32:
		return number(float64(x)), false
	}
	return v, false
}

// text cuts s to maxCell bytes, on a character boundary.
func text(s string) (string, bool) {
	if len(s) <= maxCell {
		return s, false
	}
	s = s[:maxCell]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return strings.Clone(s) + "…", true
}

// number is f, or its text when JSON has no number for it (NaN, ±Inf).
func number(f float64) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return f
}
