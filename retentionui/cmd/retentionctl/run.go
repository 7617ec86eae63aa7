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

const usage = `usage: retentionctl [-addr URL] [-json] [-timeout D] [-user NAME] [-H 'Name: value']... COMMAND [--] ARG...
commands:
  status                 every sweep's state and backlog
  due PREFIX             the due markers (the next pass clears them), longest overdue first
  pending PREFIX         every marker not cleared: due, retrying, held, parked
  parked PREFIX          the parked markers (they wait for a requeue)
  requeue PREFIX ID      put a parked marker back
  requeue PREFIX --all   put every parked marker back
  release PREFIX ID      lift a held marker's hold: due at once, its clear asked again
  why PREFIX ID          when ID will be cleared, and why not yet
Flags go before the command. An argument that starts with '-' is refused
unless it follows --, which ends the flags: retentionctl requeue PREFIX -- -ID.
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
	base           *url.URL
	header         http.Header
	user, password string // basic authentication, when user is set
	http           *http.Client
}

// errRefused is an answer other than 200 from the console, or from what
// it is mounted behind; msg is the console's own message when it gave one.
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
	asJSON := fs.Bool("json", false, "print the console's JSON instead of tables, and errors as its ErrorBody")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the service")
	hdr := headers{}
	fs.Var(hdr, "H", "a header for every request, 'Name: value' (repeatable), such as 'Authorization: Bearer TOKEN'")
	user := fs.String("user", getenv("RETENTIONCTL_USER"), "the user of HTTP basic authentication (default $RETENTIONCTL_USER)")
	password := fs.String("password", getenv("RETENTIONCTL_PASSWORD"), "the password of -user (default $RETENTIONCTL_PASSWORD, which keeps it out of the process list)")
	o := &output{stdout: stdout, stderr: stderr}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		o.json = *asJSON // when -json came before the flag at fault
		o.errorJSON(0, "retentionctl: "+err.Error())
		return exitUsage
	}
	o.json = *asJSON
	usageErr := func(format string, a ...any) int {
		o.fail(fmt.Errorf(format, a...))
		fmt.Fprintf(stderr, "run retentionctl -h for help\n")
		return exitUsage
	}
	cmd := fs.Args()
	// The flags ended with a "--" before the command: no argument is one.
	literal := len(cmd) < len(args) && args[len(args)-len(cmd)-1] == "--"
	if len(cmd) == 0 {
		return usageErr("no command")
	}
	want := map[string]int{"status": 0, "due": 1, "pending": 1, "parked": 1, "requeue": 2, "release": 2, "why": 2}
	n, ok := want[cmd[0]]
	if !ok {
		return usageErr("unknown command %q", cmd[0])
	}
	argv, err := commandArgs(cmd[0], n, cmd[1:], literal)
	if err != nil {
		return usageErr("%v", err)
	}
	if len(argv) != n {
		return usageErr("%s takes %d argument(s), got %d", cmd[0], n, len(argv))
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
	switch {
	case *password != "" && *user == "":
		return usageErr("a password (-password or $RETENTIONCTL_PASSWORD) without -user")
	case *user != "" && http.Header(hdr).Get("Authorization") != "":
		return usageErr("both -user and an Authorization header (-H): give one")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	c := &client{base: base, header: http.Header(hdr), user: *user, password: *password, http: &http.Client{Timeout: *timeout, Transport: tr}}

	var out func(io.Writer, []byte) error
	var body []byte
	switch cmd[0] {
	case "status":
		body, err = c.get(ctx, "", nil)
		out = printStatus
	case "due":
		body, err = c.get(ctx, "sweep", url.Values{"prefix": {argv[0].v}})
		out = printDue
	case "pending":
		body, err = c.get(ctx, "sweep", url.Values{"prefix": {argv[0].v}})
		out = printPending
	case "parked":
		body, err = c.get(ctx, "sweep", url.Values{"prefix": {argv[0].v}})
		out = printParked
	case "why":
		body, err = c.get(ctx, "why", url.Values{"prefix": {argv[0].v}, "id": {argv[1].v}})
		out = printWhy
	case "requeue":
		form := url.Values{"prefix": {argv[0].v}}
		if argv[1].isAll() {
			form.Set("all", "true")
		} else {
			form.Set("id", argv[1].v)
		}
		body, err = c.post(ctx, "requeue", form)
		out = printRequeued
	case "release":
		body, err = c.post(ctx, "release", url.Values{"prefix": {argv[0].v}, "id": {argv[1].v}})
		out = printReleased
	}
	if err != nil {
		return o.fail(err)
	}
	if o.json {
		_, err = stdout.Write(body)
	} else {
		err = out(stdout, body)
	}
	if err != nil {
		return o.fail(err)
	}
	return exitOK
}

// arg is an argument of a command; literal when it followed "--".
type arg struct {
	v       string
	literal bool
}

// isAll reports whether a is requeue's --all, not an id.
func (a arg) isAll() bool { return a.v == "--all" && !a.literal }

// commandArgs splits the arguments of command, which takes n, at "--".
// Before it, one that starts with '-' is refused (but requeue's --all as
// its second): it is a flag out of place, or an id or prefix (the default
// id rule allows a leading '-') that would be taken for a flag, as "-all"
// once was for --all. After it, every argument is taken as it is.
func commandArgs(command string, n int, args []string, literal bool) ([]arg, error) {
	var out []arg
	for i, a := range args {
		switch {
		case literal:
			out = append(out, arg{v: a, literal: true})
		case a == "--":
			literal = true
		case len(a) > 1 && a[0] == '-' && !(command == "requeue" && len(out) == 1 && a == "--all"):
			if n == 0 {
				return nil, fmt.Errorf("%q looks like a flag: flags go before the command", a)
			}
			before := append([]string{command}, args[:i]...)
			return nil, fmt.Errorf("%q looks like a flag: flags go before the command, "+
				"and an argument that starts with '-' goes after --, as in: retentionctl %s -- %s",
				a, shellJoin(before), shellJoin(args[i:]))
		default:
			out = append(out, arg{v: a})
		}
	}
	return out, nil
}

// shellJoin joins args for a command line, quoting those a shell would
// split or expand.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = a
		if a == "" || strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
		}) {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// output reports an invocation's errors: on stderr, and with -json as an
// ErrorBody on stdout too.
type output struct {
	stdout, stderr io.Writer
	json           bool
}

// fail reports err and returns the exit status of a refusal or of an
// unreachable service.
func (o *output) fail(err error) int {
	fmt.Fprintf(o.stderr, "retentionctl: %v\n", err)
	var refused *errRefused
	if errors.As(err, &refused) {
		o.errorJSON(refused.status, refused.msg)
	} else {
		o.errorJSON(0, "retentionctl: "+err.Error())
	}
	return exitRefused
}

// errorJSON writes, with -json, the ErrorBody of status (0 when no answer
// came) and msg on stdout.
func (o *output) errorJSON(status int, msg string) {
	if !o.json {
		return
	}
	enc := json.NewEncoder(o.stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(retentionui.ErrorBody{Status: status, Error: msg})
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
	if c.user != "" {
		req.SetBasicAuth(c.user, c.password)
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
		// The console has no authentication: a 401, and a 403 without its
		// ErrorBody (its own 403 says read-only or cross-origin), come
		// from what it is mounted behind.
		console := json.Unmarshal(body, &e) == nil && e.Error != "" && e.Status == resp.StatusCode
		switch {
		case resp.StatusCode == http.StatusUnauthorized || (resp.StatusCode == http.StatusForbidden && !console):
			msg = c.credentials(resp.StatusCode)
		case console:
			msg = e.Error
		case len(msg) > 200 || !json.Valid(body):
			msg = "not an answer of a retentionui console (is -addr where it is mounted?)"
		}
		return nil, &errRefused{status: resp.StatusCode, msg: msg}
	}
	if !json.Valid(body) || !bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")) {
		return nil, fmt.Errorf("%s answered with something other than a retentionui console's JSON (is -addr where it is mounted?)", c.base.Redacted())
	}
	return body, nil
}

// credentials says what a 401 or a 403 from in front of the console means
// for the credentials sent, and which flags give them.
func (c *client) credentials(status int) string {
	const how = "-user and -password (or $RETENTIONCTL_PASSWORD) for basic authentication, or -H 'Authorization: SCHEME CREDENTIALS'"
	sent := c.user != "" || len(c.header) > 0
	switch {
	case status == http.StatusUnauthorized && !sent:
		return "credentials are missing: give them with " + how
	case status == http.StatusUnauthorized:
		return "the credentials sent (-user, -H) were not accepted: check them, or give others with " + how
	case !sent:
		return "access refused, and no credentials were sent: give them with " + how
	}
	return "the credentials sent (-user, -H) were refused: they do not give access to the console; give others with " + how
}
