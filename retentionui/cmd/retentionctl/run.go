package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/marksweep/retention/retentionui"
)

// The exit statuses.
const (
	exitOK      = 0
	exitRefused = 1 // the service refused, or could not be reached
	exitUsage   = 2
)

const usage = `usage: retentionctl [-addr URL] [-json] [-timeout D] [-H 'Name: value']... COMMAND
commands:
  status                 every sweep's state and backlog
  due PREFIX             the due markers, longest overdue first
  parked PREFIX          the parked markers
  requeue PREFIX ID      put a parked marker back
  requeue PREFIX --all   put every parked marker back
  why PREFIX ID          when ID will be cleared, and why not yet
flags:
`

// headers is the repeatable -H flag.
type headers http.Header

func (h headers) String() string { return "" }

func (h headers) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("want 'Name: value', got %q", v)
	}
	http.Header(h).Add(strings.TrimSpace(name), strings.TrimSpace(value))
	return nil
}

// client is one invocation's connection to the console.
type client struct {
	base   *url.URL
	header http.Header
	http   *http.Client
}

// errRefused is an answer other than 200 from the console.
type errRefused struct {
	status int
	msg    string
}

func (e *errRefused) Error() string {
	return fmt.Sprintf("the service refused: %d %s: %s", e.status, http.StatusText(e.status), e.msg)
}

// run runs one command and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("retentionctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", getenv("RETENTIONCTL_ADDR"), "the console's URL, where it is mounted (default $RETENTIONCTL_ADDR)")
	asJSON := fs.Bool("json", false, "print the console's JSON instead of tables")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the service")
	hdr := headers{}
	fs.Var(hdr, "H", "a header for every request, 'Name: value' (repeatable)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "retentionctl: "+format+"\n", a...)
		fmt.Fprintf(stderr, "run retentionctl -h for help\n")
		return exitUsage
	}
	cmd := fs.Args()
	if len(cmd) == 0 {
		return usageErr("no command")
	}
	if *addr == "" {
		return usageErr("no -addr (or $RETENTIONCTL_ADDR): the URL the console is mounted at")
	}
	base, err := url.Parse(*addr)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return usageErr("-addr %q is not an http:// or https:// URL", *addr)
	}
	if !strings.HasSuffix(base.Path, "/") {
		base.Path += "/"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	c := &client{base: base, header: http.Header(hdr), http: &http.Client{Timeout: *timeout, Transport: tr}}

	want := map[string]int{"status": 0, "due": 1, "parked": 1, "requeue": 2, "why": 2}
	n, ok := want[cmd[0]]
	if !ok {
		return usageErr("unknown command %q", cmd[0])
	}
	if len(cmd)-1 != n {
		return usageErr("%s takes %d argument(s), got %d", cmd[0], n, len(cmd)-1)
	}
	var out func(io.Writer, []byte) error
	var body []byte
	switch cmd[0] {
	case "status":
		body, err = c.get(ctx, "", nil)
		out = printStatus
	case "due":
		body, err = c.get(ctx, "sweep", url.Values{"prefix": {cmd[1]}})
		out = printDue
	case "parked":
		body, err = c.get(ctx, "sweep", url.Values{"prefix": {cmd[1]}})
		out = printParked
	case "why":
		body, err = c.get(ctx, "why", url.Values{"prefix": {cmd[1]}, "id": {cmd[2]}})
		out = printWhy
	case "requeue":
		form := url.Values{"prefix": {cmd[1]}}
		if cmd[2] == "--all" || cmd[2] == "-all" {
			form.Set("all", "true")
		} else {
			form.Set("id", cmd[2])
		}
		body, err = c.post(ctx, "requeue", form)
		out = printRequeued
	}
	if err != nil {
		fmt.Fprintf(stderr, "retentionctl: %v\n", err)
		return exitRefused
	}
	if *asJSON {
		_, err = stdout.Write(body)
	} else {
		err = out(stdout, body)
	}
	if err != nil {
		fmt.Fprintf(stderr, "retentionctl: %v\n", err)
		return exitRefused
	}
	return exitOK
}

func (c *client) get(ctx context.Context, path string, q url.Values) ([]byte, error) {
	u := c.base.JoinPath(path)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	return c.do(req)
}

func (c *client) post(ctx context.Context, path string, form url.Values) ([]byte, error) {
	u := c.base.JoinPath(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return c.do(req)
}

// do sends req asking for JSON and returns the body of a 200 answer.
func (c *client) do(req *http.Request) ([]byte, error) {
	for k, v := range c.header {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the service at %s: %w", c.base.Redacted(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s: %w", c.base.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		var e retentionui.ErrorBody
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		} else if len(msg) > 200 || !json.Valid(body) {
			msg = "not an answer of a retentionui console (is -addr where it is mounted?)"
		}
		return nil, &errRefused{status: resp.StatusCode, msg: msg}
	}
	if !json.Valid(body) || !bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")) {
		return nil, fmt.Errorf("%s answered with something other than a retentionui console's JSON (is -addr where it is mounted?)", c.base.Redacted())
	}
	return body, nil
}
