package tasks

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
)

// MarkNotKept publishes the marker of task id, in review without its
// message, and waits until the stream has it. A NEEDS_REVIEW task has a
// message on its review subject (gantry.review.<id>) for as long as it is
// in review: its kept message, or this marker when the message could not
// be kept (too large, or not in a restored backup). So ReviewIDs finds the
// tasks in review without reading every task record.
func MarkNotKept(ctx context.Context, js jetstream.JetStream, id string) error {
	m := nats.NewMsg(wire.ReviewSubject(id))
	m.Header.Set(wire.HeaderNotKept, "1")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("mark task %s in review: %w", id, err)
	}
	return nil
}

// ForgetReview removes what the review subject of task id holds: its kept
// message or its marker, those stored before sequence before when it is
// not 0. A retry passes the sequence it republished the task at, so that
// the copy a new run keeps, should it go to review again at once, stays.
func ForgetReview(ctx context.Context, stream jetstream.Stream, id string, before uint64) error {
	opts := []jetstream.StreamPurgeOpt{jetstream.WithPurgeSubject(wire.ReviewSubject(id))}
	if before > 0 {
		opts = append(opts, jetstream.WithPurgeSequence(before))
	}
	if err := stream.Purge(ctx, opts...); err != nil {
		return fmt.Errorf("remove the kept message of task %s: %w", id, err)
	}
	return nil
}

// ReviewIDs returns the ids of the tasks with a message on their review
// subject, from the stream's count of messages per subject: no message is
// read. A purge or retry that was cut off can leave a message behind: a
// caller checks each id's record.
func ReviewIDs(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	stream, err := js.Stream(ctx, wire.StreamTasks)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(wire.SubjectReviewAll))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", wire.StreamTasks, err)
	}
	ids := make([]string, 0, len(info.State.Subjects))
	for subject := range info.State.Subjects {
		if id, ok := strings.CutPrefix(subject, wire.SubjectReviewPrefix+"."); ok && wire.ValidTaskID(id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
