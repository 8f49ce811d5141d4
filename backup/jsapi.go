package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
)

// JetStream's stream snapshot and restore API. The jetstream package of
// nats.go does not offer it, so it is spoken here: a snapshot request names
// an inbox, the server answers with the stream's configuration and state
// and then sends the archive (s2-compressed) to the inbox in chunks, each
// acknowledged by a reply, ending with an empty message whose status is
// 204 (or an error status); a restore request with the configuration and
// state is answered with a subject to send the archive to, chunk by chunk
// as requests, and an empty request ends it and is answered with the
// created stream.
const (
	apiSnapshot = "$JS.API.STREAM.SNAPSHOT."
	apiRestore  = "$JS.API.STREAM.RESTORE."
	// chunkSize is the size of the archive chunks both ways.
	chunkSize = 128 << 10
	// chunkIdle bounds the wait for the next chunk of a snapshot: the
	// server sends them without pause while it has a window to fill.
	chunkIdle = 30 * time.Second
	// apiTimeout bounds a request to the JetStream API, and each chunk of
	// a restore.
	apiTimeout = 30 * time.Second
	// finishTimeout bounds the server's work after the last chunk of a
	// restore, when it builds the stream from the archive.
	finishTimeout = 30 * time.Minute
)

// apiError is an error answer of the JetStream API.
type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s (code %d, err_code %d)", e.Description, e.Code, e.ErrCode)
}

// streamState is the part of a stream's state a backup records.
type streamState struct {
	Messages  uint64 `json:"messages"`
	Bytes     uint64 `json:"bytes"`
	FirstSeq  uint64 `json:"first_seq"`
	LastSeq   uint64 `json:"last_seq"`
	Consumers int    `json:"consumer_count"`
}

// snapshotReply is the server's answer to a snapshot request. Config and
// State, as they are, make the restore request.
type snapshotReply struct {
	Error  *apiError       `json:"error,omitempty"`
	Config json.RawMessage `json:"config"`
	State  json.RawMessage `json:"state"`
}

// restoreRequest is what a restore is asked with: a snapshot's meta file.
type restoreRequest struct {
	Config json.RawMessage `json:"config"`
	State  json.RawMessage `json:"state"`
}

// restoreReply answers a restore request: where to send the archive.
type restoreReply struct {
	Error          *apiError `json:"error,omitempty"`
	DeliverSubject string    `json:"deliver_subject"`
}

// createReply is the server's answer to the end of a restore.
type createReply struct {
	Error *apiError    `json:"error,omitempty"`
	State *streamState `json:"state,omitempty"`
}

// snapshot takes a snapshot of stream, consumers included, writing the
// archive to w and calling progress with the bytes written so far after
// each chunk. It returns the meta file (the restore request) and the
// stream's state at the snapshot.
func snapshot(ctx context.Context, nc *nats.Conn, stream string, w io.Writer, progress func(int64)) ([]byte, streamState, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, streamState{}, fmt.Errorf("subscribe %s: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, streamState{}, fmt.Errorf("subscribe %s: %w", inbox, err)
	}
	req, err := json.Marshal(map[string]any{"deliver_subject": inbox, "chunk_size": chunkSize})
	if err != nil {
		return nil, streamState{}, err
	}
	var reply snapshotReply
	if err := apiRequest(ctx, nc, apiSnapshot+stream, req, &reply); err != nil {
		return nil, streamState{}, err
	}
	if reply.Error != nil {
		return nil, streamState{}, reply.Error
	}
	var state streamState
	if err := json.Unmarshal(reply.State, &state); err != nil {
		return nil, streamState{}, fmt.Errorf("decode stream state: %w", err)
	}
	meta, err := json.MarshalIndent(restoreRequest{Config: reply.Config, State: reply.State}, "", "  ")
	if err != nil {
		return nil, streamState{}, err
	}
	var n int64
	for {
		cctx, cancel := context.WithTimeout(ctx, chunkIdle)
		m, err := sub.NextMsgWithContext(cctx)
		cancel()
		if err != nil {
			return nil, streamState{}, fmt.Errorf("receive snapshot after %d bytes: %w", n, err)
		}
		if len(m.Data) == 0 {
			if status := m.Header.Get("Status"); status != "" && status != "204" {
				return nil, streamState{}, fmt.Errorf("snapshot ended after %d bytes: %s %s", n, status, m.Header.Get("Description"))
			}
			return meta, state, nil
		}
		// Acknowledge first: the chunk is in memory, and a slow disk must
		// not run the server's flow control out of time.
		if m.Reply != "" {
			if err := m.Respond(nil); err != nil {
				return nil, streamState{}, fmt.Errorf("acknowledge snapshot chunk: %w", err)
			}
		}
		if _, err := w.Write(m.Data); err != nil {
			return nil, streamState{}, fmt.Errorf("write snapshot: %w", err)
		}
		n += int64(len(m.Data))
		if progress != nil {
			progress(n)
		}
	}
}

// restore creates stream from a snapshot: meta is its meta file, r its
// archive. progress is called with the bytes sent so far after each
// chunk. It returns the restored stream's state.
func restore(ctx context.Context, nc *nats.Conn, stream string, meta []byte, r io.Reader, progress func(int64)) (streamState, error) {
	var reply restoreReply
	if err := apiRequest(ctx, nc, apiRestore+stream, meta, &reply); err != nil {
		return streamState{}, err
	}
	if reply.Error != nil {
		return streamState{}, reply.Error
	}
	buf := make([]byte, chunkSize)
	var n int64
	for {
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			if err := sendChunk(ctx, nc, reply.DeliverSubject, buf[:k]); err != nil {
				return streamState{}, fmt.Errorf("send archive after %d bytes: %w", n, err)
			}
			n += int64(k)
			if progress != nil {
				progress(n)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return streamState{}, fmt.Errorf("read archive: %w", rerr)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, finishTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(fctx, reply.DeliverSubject, nil)
	if err != nil {
		return streamState{}, fmt.Errorf("finish restore: %w", err)
	}
	var created createReply
	if err := json.Unmarshal(m.Data, &created); err != nil {
		return streamState{}, fmt.Errorf("finish restore: decode %q: %w", m.Data, err)
	}
	if created.Error != nil {
		return streamState{}, fmt.Errorf("finish restore: %w", created.Error)
	}
	if created.State == nil {
		return streamState{}, fmt.Errorf("finish restore: no stream state in %q", m.Data)
	}
	return *created.State, nil
}

// sendChunk sends one chunk of a restore's archive; the server answers an
// empty message, or an error.
func sendChunk(ctx context.Context, nc *nats.Conn, subject string, chunk []byte) error {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(cctx, subject, chunk)
	if err != nil {
		return err
	}
	if len(m.Data) == 0 {
		return nil
	}
	var created createReply
	if err := json.Unmarshal(m.Data, &created); err != nil || created.Error == nil {
		return fmt.Errorf("unexpected answer %q", m.Data)
	}
	return created.Error
}

// apiRequest sends a JetStream API request and decodes its answer into v.
func apiRequest(ctx context.Context, nc *nats.Conn, subject string, req []byte, v any) error {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(cctx, subject, req)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%s: %w (is JetStream enabled on the server?)", subject, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", subject, err)
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		return fmt.Errorf("%s: decode %q: %w", subject, m.Data, err)
	}
	return nil
}
