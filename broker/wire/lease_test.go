package wire

import "testing"

func TestResourceMoveRefusedSubject(t *testing.T) {
	t.Parallel()
	if got, want := EventResourceMoveRefused.Subject(), "gantry.audit.resource.move_refused"; got != want {
		t.Errorf("Subject = %q, want %q", got, want)
	}
	if !EventResourceMoveRefused.Known() {
		t.Error("Known = false, want true")
	}
}
