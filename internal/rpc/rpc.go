// Package rpc is gantry's one request-reply convention, for both sides.
//
// Every service is a NATS micro service (github.com/nats-io/nats.go/micro,
// listed by `nats micro ls`). A request body is JSON. A success reply is a
// JSON body without error headers; a failure is an empty body with the
// headers Nats-Service-Error-Code (a status code) and Nats-Service-Error (a
// description). The codes come from the kv error vocabulary:
//
//	400  kv.ErrInvalid      bad input, refused before anything was done
//	404  kv.ErrNotFound     no such thing
//	409  kv.ErrConflict     held or run by someone else (also kv.ErrExists, kv.ErrChanged)
//	503  kv.ErrUnavailable  cannot answer now; try again later
//	500  anything else
//
// Respond maps a handler's error to its code; Request turns a code back into
// an *Error that matches the same vocabulary with errors.Is, so a caller
// tests errors.Is(err, kv.ErrNotFound) whether the error came from a local
// store or from a service on another machine.
package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/gantry-dev/gantry/kv"
)

// Version is the version every gantry micro service registers.
const Version = "1.0.0"

// The status codes of the Nats-Service-Error-Code header.
const (
	CodeInvalid     = "400"
	CodeNotFound    = "404"
	CodeConflict    = "409"
	CodeInternal    = "500"
	CodeUnavailable = "503"
)

// ErrNoResponders is returned by Request when no service listens on the
// subject. It matches kv.ErrUnavailable.
var ErrNoResponders = kv.Sentinel("no service answers", kv.ErrUnavailable)

// Error is a failure answer of a service: its code and description.
type Error struct {
	Subject     string
	Code        string
	Description string
}

// Error returns the service's description.
func (e *Error) Error() string {
	if e.Description == "" {
		return fmt.Sprintf("%s answered error %s", e.Subject, e.Code)
	}
	return e.Description
}

// Is matches the kv vocabulary entry of e's code: errors.Is(err,
// kv.ErrNotFound) holds for a 404.
func (e *Error) Is(target error) bool {
	switch e.Code {
	case CodeInvalid:
		return target == kv.ErrInvalid
	case CodeNotFound:
		return target == kv.ErrNotFound
	case CodeConflict:
		return target == kv.ErrConflict
	case CodeUnavailable:
		return target == kv.ErrUnavailable
	}
	return false
}

// Code returns the status code err maps to.
func Code(err error) string {
	switch {
	case errors.Is(err, kv.ErrInvalid):
		return CodeInvalid
	case errors.Is(err, kv.ErrNotFound):
		return CodeNotFound
	case errors.Is(err, kv.ErrConflict), errors.Is(err, kv.ErrExists), errors.Is(err, kv.ErrChanged):
		return CodeConflict
	case errors.Is(err, kv.ErrUnavailable):
		return CodeUnavailable
	}
	return CodeInternal
}

// Endpoint is one endpoint of a service.
type Endpoint struct {
	// Name names the endpoint in the service's info and stats.
	Name string
	// Subject is the subject it answers on.
	Subject string
	// Handler handles each request, on the endpoint's subscription
	// goroutine: one request at a time.
	Handler micro.HandlerFunc
	// QueueGroup is the queue group the instances of the service share, so
	// that one of them gets each request. Defaults to micro's ("q").
	QueueGroup string
	// Everyone delivers every request to every instance (no queue group):
	// for a request only the instance concerned answers, the others
	// staying silent.
	Everyone bool
}

// AddService registers the micro service name on nc with its endpoints.
// Stop it with its Stop method.
func AddService(nc *nats.Conn, name, description string, endpoints ...Endpoint) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{Name: name, Version: Version, Description: description})
	if err != nil {
		return nil, fmt.Errorf("add service %s: %w", name, err)
	}
	for _, ep := range endpoints {
		opts := []micro.EndpointOpt{micro.WithEndpointSubject(ep.Subject)}
		switch {
		case ep.Everyone:
			opts = append(opts, micro.WithEndpointQueueGroupDisabled())
		case ep.QueueGroup != "":
			opts = append(opts, micro.WithEndpointQueueGroup(ep.QueueGroup))
		}
		if err := svc.AddEndpoint(ep.Name, ep.Handler, opts...); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("add endpoint %s of %s: %w", ep.Subject, name, err)
		}
	}
	// The server has the endpoints' subscriptions once it answers a ping: a
	// component that reports ready after this is one a request reaches (a
	// client acting on "gantry ready" got "no service answers" without it).
	if err := nc.Flush(); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("add service %s: %w", name, err)
	}
	return svc, nil
}

// Decode reads req's JSON body into v. An empty body leaves v as it is. A
// body that is not JSON of v's shape is an error matching kv.ErrInvalid.
func Decode(req micro.Request, v any) error {
	if len(req.Data()) == 0 {
		return nil
	}
	if err := json.Unmarshal(req.Data(), v); err != nil {
		return fmt.Errorf("%w: request on %s is not the JSON expected: %v", kv.ErrInvalid, req.Subject(), err)
	}
	return nil
}

// Respond answers req: with v as JSON when err is nil, otherwise with err's
// code and message in the error headers. A request without a reply subject
// (a plain publish) gets no answer. A reply over the connection's message
// limit is never dropped: the requester gets a 500 saying so.
func Respond(req micro.Request, v any, err error) error {
	if req.Reply() == "" {
		return nil
	}
	if err != nil {
		return req.Error(Code(err), description(err), nil)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return req.Error(CodeInternal, "encode reply: "+err.Error(), nil)
	}
	err = req.Respond(data)
	// micro passes the connection's error on as text only.
	if err != nil && strings.Contains(err.Error(), nats.ErrMaxPayload.Error()) {
		return errors.Join(err, req.Error(CodeInternal, fmt.Sprintf("reply of %d bytes is over the broker's message limit", len(data)), nil))
	}
	return err
}

// description is err's message as one header line.
func description(err error) string {
	d := strings.Join(strings.Fields(err.Error()), " ")
	if d == "" {
		return "error"
	}
	return d
}

// Request sends req (JSON; nil sends an empty body) on subject and decodes a
// success reply into reply (unless nil). A failure answer is an *Error; no
// service on the subject is ErrNoResponders. ctx must have a deadline.
func Request(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	var data []byte
	if req != nil {
		var err error
		if data, err = json.Marshal(req); err != nil {
			return fmt.Errorf("encode request on %s: %w", subject, err)
		}
	}
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%s: %w", subject, ErrNoResponders)
	}
	if err != nil {
		return fmt.Errorf("request %s: %w", subject, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		return &Error{Subject: subject, Code: code, Description: msg.Header.Get(micro.ErrorHeader)}
	}
	if reply == nil {
		return nil
	}
	if err := json.Unmarshal(msg.Data, reply); err != nil {
		return fmt.Errorf("decode reply on %s: %w", subject, err)
	}
	return nil
}

// Detach returns req as a request answered through nc, which may be
// answered after the handler has returned. A micro.Request may not: micro
// reads what the handler's answer did once Handle returns, so an answer
// sent from another goroutine races with that read.
func Detach(nc *nats.Conn, req micro.Request) micro.Request {
	return &detached{nc: nc, subject: req.Subject(), reply: req.Reply(), data: req.Data(), headers: req.Headers()}
}

// detached is a micro.Request answered through a connection.
type detached struct {
	nc             *nats.Conn
	subject, reply string
	data           []byte
	headers        micro.Headers
}

func (d *detached) Respond(data []byte, opts ...micro.RespondOpt) error {
	return d.publish(&nats.Msg{Data: data}, opts)
}

func (d *detached) RespondJSON(v any, opts ...micro.RespondOpt) error {
	data, err := json.Marshal(v)
	if err != nil {
		return micro.ErrMarshalResponse
	}
	return d.Respond(data, opts...)
}

func (d *detached) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	if code == "" || description == "" {
		return fmt.Errorf("%w: error code and description", micro.ErrArgRequired)
	}
	return d.publish(&nats.Msg{Data: data, Header: nats.Header{micro.ErrorHeader: {description}, micro.ErrorCodeHeader: {code}}}, opts)
}

func (d *detached) publish(m *nats.Msg, opts []micro.RespondOpt) error {
	m.Subject = d.reply
	for _, o := range opts {
		o(m)
	}
	return d.nc.PublishMsg(m)
}

func (d *detached) Data() []byte           { return d.data }
func (d *detached) Headers() micro.Headers { return d.headers }
func (d *detached) Subject() string        { return d.subject }
func (d *detached) Reply() string          { return d.reply }
