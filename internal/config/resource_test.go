package config

import (
	"errors"
	"strings"
	"testing"
)

func TestResourceSection(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte("resources:\n  - {id: cam1, reclaim: fault}\n  - {id: 'lab/printer-2'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Resources; len(got) != 2 || got[0].Reclaim != "fault" || got[1].ID != "lab/printer-2" || got[1].Reclaim != "" {
		t.Errorf("resources = %+v, want cam1 (reclaim fault) and lab/printer-2", got)
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"bad reclaim", "resources: [{id: a, reclaim: sometimes}]\n", `reclaim "sometimes": want available or fault`},
		{"id not a key", "resources: [{id: 'cam:1'}]\n", `id "cam:1" may hold only`},
		{"unknown key", "resources: [{id: a, reclam: fault}]\n", `unknown key "reclam"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.doc))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}
