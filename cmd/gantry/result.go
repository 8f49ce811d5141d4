package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gantry-dev/gantry/broker/wire"
)

// printResult writes a task's result after 'gantry task get's table: a sql
// task's as fields and a table of its rows, any other as indented JSON.
func (a *app) printResult(rec wire.TaskRecord) error {
	if len(rec.Result) == 0 {
		return nil
	}
	fmt.Fprintln(a.stdout, "\nresult:")
	var res wire.SQLResult
	dec := json.NewDecoder(bytes.NewReader(rec.Result))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if rec.Type != "sql" || dec.Decode(&res) != nil {
		var out bytes.Buffer
		if err := json.Indent(&out, rec.Result, "", "  "); err != nil {
			out.Reset()
			out.Write(rec.Result)
		}
		_, err := fmt.Fprintln(a.stdout, out.String())
		return err
	}
	var fields [][]string
	if res.RowsAffected != nil {
		fields = append(fields, []string{"rows_affected", strconv.FormatInt(*res.RowsAffected, 10)})
	}
	if res.ReturnStatus != nil {
		fields = append(fields, []string{"return_status", strconv.FormatInt(*res.ReturnStatus, 10)})
	}
	names := make([]string, 0, len(res.Out))
	for k := range res.Out {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		fields = append(fields, []string{"out." + k, cellText(res.Out[k])})
	}
	if len(fields) > 0 {
		if err := a.printTable([]string{"FIELD", "VALUE"}, fields); err != nil {
			return err
		}
	}
	if len(res.Columns) > 0 {
		if len(fields) > 0 {
			fmt.Fprintln(a.stdout)
		}
		rows := make([][]string, 0, len(res.Rows))
		for _, r := range res.Rows {
			row := make([]string, len(r))
			for i, v := range r {
				row[i] = cellText(v)
			}
			rows = append(rows, row)
		}
		header := make([]string, len(res.Columns))
		for i, c := range res.Columns {
			header[i] = strings.ToUpper(c)
		}
		if err := a.printTable(header, rows); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "(%d row(s))\n", len(res.Rows))
	}
	if res.Truncated {
		fmt.Fprintln(a.stdout, "(truncated: the result held more than was kept; see max_rows)")
	}
	return nil
}

// cellText is a result value as a table shows it: text as it is, NULL for
// null, anything else as JSON; on one line, cut to 60 characters.
func cellText(v any) string {
	var s string
	switch x := v.(type) {
	case nil:
		s = "NULL"
	case string:
		s = x
	default:
		data, _ := json.Marshal(x)
		s = string(data)
	}
	s = strings.Join(strings.Fields(s), " ")
	return truncate(s, 60)
}
