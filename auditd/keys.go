package auditd

import (
	"encoding/binary"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Key spaces: events under 'd' (by day, then time), index keys under 'x'.
const (
	spaceEvents byte = 'd'
	spaceIndex  byte = 'x'
	// kindEvent marks an event key after its day.
	kindEvent byte = 'e'
)

// Index kinds: the byte after spaceIndex.
const (
	kindTask     byte = 'k'
	kindResource byte = 'r'
	kindRoute    byte = 'o'
	kindJob      byte = 'j'
	kindType     byte = 'y'
	kindLevel    byte = 'l'
)

const nsPerDay = int64(24 * time.Hour)

// index is one secondary index entry of an event.
type index struct {
	kind  byte
	value string
}

// indexesOf lists the secondary index entries of ev: one per set field.
// Level info is not indexed: most events are info, and for those a scan of
// the events in time order is as cheap as an index.
func indexesOf(ev *wire.Event) []index {
	out := make([]index, 0, 6)
	for _, ix := range []index{
		{kindTask, ev.TaskID}, {kindResource, ev.ResourceID}, {kindRoute, ev.RouteID},
		{kindJob, ev.JobID}, {kindType, string(ev.Type)}, {kindLevel, indexedLevel(ev.Level)},
	} {
		if ix.value != "" {
			out = append(out, ix)
		}
	}
	return out
}

// indexedLevel returns level if it has a secondary index, or "".
func indexedLevel(level wire.Level) string {
	if level == wire.LevelInfo {
		return ""
	}
	return string(level)
}

// timeBytes encodes t as 8 bytes that sort as t does, before 1970 too.
func timeBytes(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano())^(1<<63))
}

// timeOfBytes decodes timeBytes.
func timeOfBytes(b []byte) time.Time {
	return time.Unix(0, int64(binary.BigEndian.Uint64(b)^(1<<63)))
}

// dayOf returns the sortable number of t's UTC day.
func dayOf(t time.Time) uint32 {
	ns := t.UnixNano()
	d := ns / nsPerDay
	if ns%nsPerDay < 0 {
		d--
	}
	return uint32(int32(d)) ^ (1 << 31)
}

// eventsBefore is the first event key at t: every event older than t sorts
// before it.
func eventsBefore(t time.Time) []byte {
	return append(groupPrefix(dayOf(t), kindEvent, ""), timeBytes(t)...)
}

// groupPrefix is the common prefix of the keys of one kind and value: the
// events of one day (kindEvent), or one value's index keys.
func groupPrefix(day uint32, kind byte, value string) []byte {
	if kind == kindEvent {
		return append(binary.BigEndian.AppendUint32([]byte{spaceEvents}, day), kindEvent)
	}
	k := append([]byte{spaceIndex, kind}, value...)
	return append(k, 0)
}

// primaryKey is the key of the event with id at t.
func primaryKey(t time.Time, id string) []byte {
	return append(eventsBefore(t), id...)
}

// primaryKeyFromSuffix is the key of the event whose <time><id> is suffix.
func primaryKeyFromSuffix(suffix []byte) []byte {
	return append(groupPrefix(dayOf(timeOfBytes(suffix[:8])), kindEvent, ""), suffix...)
}

// secondaryKey is an index key of the event whose <time><id> is suffix.
func secondaryKey(kind byte, value string, suffix []byte) []byte {
	return append(groupPrefix(0, kind, value), suffix...)
}

// prefixEnd returns the smallest key greater than every key starting with
// p, or nil (no bound) when there is none.
func prefixEnd(p []byte) []byte {
	end := append([]byte{}, p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}
