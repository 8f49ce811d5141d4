package wire

import "testing"

func TestOutputGolden(t *testing.T) {
	t.Parallel()
	line := OutputLine{TaskID: "task-1", Attempt: 2, Seq: 7, Stream: OutputStderr, Time: t0, Line: "warming up", Cut: true, Dropped: 3}
	cases := map[string]any{
		"output_line":         line,
		"task_output_request": TaskOutputRequest{ID: "task-1"},
		"task_output_reply":   TaskOutputReply{ID: "task-1", Attempt: 2, Worker: "pc-1-123", Lines: []OutputLine{line}},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			golden(t, name, v)
		})
	}
}

func TestOutputSubject(t *testing.T) {
	t.Parallel()
	if got, want := OutputSubject("task-1"), "gantry.output.task-1"; got != want {
		t.Errorf("OutputSubject = %q, want %q", got, want)
	}
	if got, want := EventAttemptLost.Subject(), "gantry.audit.task.attempt_lost"; got != want {
		t.Errorf("ATTEMPT_LOST subject = %q, want %q", got, want)
	}
}

func TestRedactLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain line, nothing to hide":               "plain line, nothing to hide",
		"API_TOKEN=abc123 user=bob":                 "API_TOKEN=[REDACTED] user=bob",
		"password: hunter2":                         "password: [REDACTED]",
		"Authorization: Bearer eyJhbGc.x.y":         "Authorization: [REDACTED]",
		`connecting with "db_password": "s3cr=t"`:   `connecting with "db_password": "[REDACTED]"`,
		`{"user":"bob","token":"t-1"}`:              `{"token":"[REDACTED]","user":"bob"}`,
		"export AWS_SECRET_ACCESS_KEY='k/ey' && go": "export AWS_SECRET_ACCESS_KEY='[REDACTED]' && go",
		"cookie=a; session=b":                       "cookie=[REDACTED]; session=[REDACTED]",
		"the secret is out":                         "the secret is out",
		"login failed: pw=hunter2":                  "login failed: pw=[REDACTED]",
		"DB_PASS=x PWD=/srv auth: basic dTpw":       "DB_PASS=[REDACTED] PWD=[REDACTED] auth: [REDACTED]",
		`{"sessionId":"s1","n":1}`:                  `{"n":1,"sessionId":"[REDACTED]"}`,
		"tests passed: 5, author: bob, sessions=2":  "tests passed: 5, author: bob, sessions=2",
	} {
		if got := RedactLine(in); got != want {
			t.Errorf("RedactLine(%q) = %q, want %q", in, got, want)
		}
	}
}
