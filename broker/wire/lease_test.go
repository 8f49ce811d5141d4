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

func TestWaiterKey(t *testing.T) {
	t.Parallel()
	key := WaiterKey("cam/1", "01JDZ0000000000000000000AA")
	if key != "cam/1.01JDZ0000000000000000000AA" {
		t.Errorf("WaiterKey = %q, want cam/1.01JDZ0000000000000000000AA", key)
	}
	if res, ok := WaiterResource(key); !ok || res != "cam/1" {
		t.Errorf("WaiterResource(%q) = %q, %v; want cam/1, true", key, res, ok)
	}
	for _, bad := range []string{"cam1", ".x", "cam1.", ""} {
		if res, ok := WaiterResource(bad); ok {
			t.Errorf("WaiterResource(%q) = %q, true; want false", bad, res)
		}
	}
	if got, want := EventResourceWaiting.Subject(), "gantry.audit.resource.waiting"; got != want {
		t.Errorf("Subject = %q, want %q", got, want)
	}
}
