package retention

import (
	"flag"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var updateREADME = flag.Bool("update-readme", false, "rewrite the Go blocks of README.md and docs/*.md from the code they show")

// readmeCode marks the Go block that follows it as the source of named
// declarations: <!-- code: boltkv/example_test.go finishJob newJobSweep -->
var readmeCode = regexp.MustCompile(`^<!-- code: (\S+)((?: \S+)+) -->$`)

// docFiles are the project's docs for users: the READMEs, BENCHMARKS.md
// and the guides.
func docFiles(t testing.TB) []string {
	guides, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, guides, "no guide in docs/")
	return append([]string{"README.md", "BENCHMARKS.md", filepath.Join("retentionui", "README.md")}, guides...)
}

// TestREADMECode keeps the Go code of README.md and the guides in docs/
// compiled and run: every ```go block must follow a code marker and equal
// the declarations it names (doc comments left out), which live in Example
// files of the modules (or in the library itself), so that go test builds
// them and runs most of them. Paths in markers are from the repository's
// root. go test -run TestREADMECode -update-readme rewrites the blocks.
func TestREADMECode(t *testing.T) {
	t.Parallel()
	for _, file := range docFiles(t) {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			blocks := checkCodeBlocks(t, file)
			if file == "README.md" {
				require.Positive(t, blocks, "README.md has no ```go block: is this the right file?")
			}
		})
	}
}

// checkCodeBlocks checks the ```go blocks of one Markdown file against the
// declarations they name, rewrites them with -update-readme, and returns
// how many there are.
func checkCodeBlocks(t *testing.T, file string) int {
	readme, err := os.ReadFile(file)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(readme), "\n")
	var out strings.Builder
	blocks := 0
	for i := 0; i < len(lines); i++ {
		out.WriteString(lines[i])
		if strings.TrimSpace(lines[i]) != "```go" {
			continue
		}
		blocks++
		end := i + 1
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		require.Less(t, end, len(lines), "%s:%d: unterminated ```go block", file, i+1)
		got := strings.Join(lines[i+1:end], "")
		marker := ""
		for j := i - 1; j >= 0; j-- {
			if s := strings.TrimSpace(lines[j]); s != "" {
				marker = s
				break
			}
		}
		m := readmeCode.FindStringSubmatch(marker)
		if m == nil {
			t.Errorf("%s:%d: a ```go block without a <!-- code: FILE NAME... --> line before it: "+
				"put the code in an Example file and name it there, so that it compiles", file, i+1)
			out.WriteString(got)
			i = end - 1
			continue
		}
		want, err := declSource(m[1], strings.Fields(m[2]))
		if err != nil {
			t.Errorf("%s:%d: %v", file, i+1, err)
			out.WriteString(got)
		} else {
			if got != want {
				t.Errorf("%s:%d: the block differs from %s %s (run go test -run TestREADMECode -update-readme); want:\n%s", file, i+1, m[1], m[2], want)
			}
			out.WriteString(want)
		}
		i = end - 1
	}
	if *updateREADME && out.String() != string(readme) {
		require.NoError(t, os.WriteFile(file, []byte(out.String()), 0o644))
	}
	return blocks
}

// TestDocsLinksResolve: every relative link of the docs names a file or
// folder of the repository, and every #anchor a heading of its target.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, file := range docFiles(t) {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(src), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			if path == "" {
				path = file
			} else {
				path = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
			}
			_, err := os.Stat(path)
			if !assert.NoError(t, err, "%s: link %s", file, target) || anchor == "" {
				continue
			}
			body, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.True(t, slices.Contains(markdownAnchors(string(body)), anchor), "%s: link %s: no such heading", file, target)
		}
	}
}

// markdownAnchors returns the anchors a code host derives from a Markdown
// file's headings: lower case, spaces to hyphens, punctuation dropped.
func markdownAnchors(md string) []string {
	var anchors []string
	inCode := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range title {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors = append(anchors, b.String())
	}
	return anchors
}

// TestDocsNameNoHostNorHistory: the docs say "the module proxy", not a
// host's name, and state what is, not which issue or run changed it (git
// history keeps that).
func TestDocsNameNoHostNorHistory(t *testing.T) {
	t.Parallel()
	hosts := regexp.MustCompile(`(?i)proxy\.golang\.org|sum\.golang\.org|pkg\.go\.dev|goproxy\.`)
	history := regexp.MustCompile(`(?i:\bissue \d+|\bthis change\b|\blast session\b)|\b[Rr]uns? [A-Z]\b`)
	for _, file := range docFiles(t) {
		if file == filepath.Join("docs", "architecture.md") {
			continue // kept by its own author
		}
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		for i, line := range strings.Split(string(src), "\n") {
			if m := hosts.FindString(line); m != "" {
				t.Errorf("%s:%d: names a package host (%s): say \"the module proxy\"", file, i+1, m)
			}
			if m := history.FindString(line); m != "" {
				t.Errorf("%s:%d: narrates history (%q): say what is", file, i+1, m)
			}
		}
	}
}

// declSource returns the source of the named top-level functions and types
// of a Go file, without their doc comments, separated by blank lines.
func declSource(path string, names []string) (string, error) {
	src, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		return "", err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return "", err
	}
	var parts []string
	for _, name := range names {
		var node ast.Node
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.Name == name {
					node = d
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.Name == name && len(d.Specs) == 1 {
						node = d
					}
				}
			}
		}
		if node == nil {
			return "", fmt.Errorf("%s declares no function or type %s", path, name)
		}
		var start token.Pos
		switch n := node.(type) {
		case *ast.FuncDecl:
			start = n.Type.Pos() // after the doc comment
		case *ast.GenDecl:
			start = n.TokPos
		}
		parts = append(parts, string(src[fset.Position(start).Offset:fset.Position(node.End()).Offset]))
	}
	return strings.Join(parts, "\n\n") + "\n", nil
}

// TestDocCommentsHaveNoCode keeps Go code out of the library's doc
// comments, where nothing compiles it: code goes in Example functions,
// which godoc shows next to the docs and go test compiles. Blocks that are
// not Go (a list of metrics) may stay.
func TestDocCommentsHaveNoCode(t *testing.T) {
	t.Parallel()
	// Every folder of the repository, so that a new package is checked too.
	var dirs []string
	require.NoError(t, filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); path != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		dirs = append(dirs, path)
		return nil
	}))
	for _, pkg := range []string{".", "kvtest", "leasetest", "boltkv", "pgkv", "rediskv", "etcdkv", "sqlkv", "retentionprom", "retentionotel"} {
		require.Contains(t, dirs, pkg)
	}
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			require.NoError(t, err)
			for _, cg := range docComments(f) {
				var p comment.Parser
				for _, b := range p.Parse(cg.Text()).Content {
					if code, ok := b.(*comment.Code); ok && looksLikeGo(code.Text) {
						t.Errorf("%s: a code block in a doc comment, which nothing compiles: move it to an Example\n%s",
							fset.Position(cg.Pos()), code.Text)
					}
				}
			}
		}
	}
}

// docComments returns the doc comments of a file: the package's, and those
// of its declarations, specs, fields and methods.
func docComments(f *ast.File) []*ast.CommentGroup {
	var docs []*ast.CommentGroup
	add := func(cg *ast.CommentGroup) {
		if cg != nil {
			docs = append(docs, cg)
		}
	}
	add(f.Doc)
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			add(n.Doc)
			return false // comments in bodies are not docs
		case *ast.GenDecl:
			add(n.Doc)
		case *ast.TypeSpec:
			add(n.Doc)
		case *ast.ValueSpec:
			add(n.Doc)
		case *ast.Field:
			add(n.Doc)
		}
		return true
	})
	return docs
}

// TestREADMELockers checks that the adapters' NewLocker constructors agree
// (a client, a name, *LockerOptions) and that docs/fleet.md, the guide that
// lists the lockers, shows each with the signature it has.
func TestREADMELockers(t *testing.T) {
	t.Parallel()
	fleet, err := os.ReadFile(filepath.Join("docs", "fleet.md"))
	require.NoError(t, err)
	for _, pkg := range []string{"pgkv", "rediskv", "etcdkv", "sqlkv"} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.Join(pkg, "lease.go"), nil, 0)
		require.NoError(t, err)
		var params []string
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Name.Name != "NewLocker" {
				continue
			}
			for _, field := range fn.Type.Params.List {
				var typ strings.Builder
				require.NoError(t, printer.Fprint(&typ, fset, field.Type))
				for _, name := range field.Names {
					params = append(params, name.Name+" "+typ.String())
				}
			}
		}
		require.Len(t, params, 3, "%s.NewLocker takes %v, want a client, a name and options", pkg, params)
		require.Regexp(t, ` string$`, params[1], "%s.NewLocker's second parameter", pkg)
		require.Equal(t, "opts *LockerOptions", params[2], "%s.NewLocker's last parameter", pkg)
		params[2] = "opts *" + pkg + ".LockerOptions"
		// A client of the package's own type reads qualified, as the others'.
		if name, typ, _ := strings.Cut(params[0], " "); ast.IsExported(strings.TrimPrefix(typ, "*")) {
			bare := strings.TrimPrefix(typ, "*")
			params[0] = name + " " + typ[:len(typ)-len(bare)] + pkg + "." + bare
		}
		want := "`" + pkg + ".NewLocker(" + strings.Join(params, ", ") + ")`"
		require.Contains(t, string(fleet), want, "docs/fleet.md does not show %s.NewLocker as it is", pkg)
	}
}

// looksLikeGo reports whether a doc comment's code block is Go: it parses
// as declarations or statements, or it is a fragment with a := in it.
func looksLikeGo(text string) bool {
	if strings.Contains(text, ":=") {
		return true
	}
	fset := token.NewFileSet()
	if _, err := parser.ParseFile(fset, "", "package p\n"+text, 0); err == nil {
		return true
	}
	_, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+text+"\n}", 0)
	return err == nil
}

func TestLooksLikeGo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		text string
		want bool
	}{
		{"kvtest.Run(t, memStore)\n", true},
		{"func TestX(t *testing.T) {\n\tkvtest.Run(t, f)\n}\n", true},
		{"c, _ := retentionprom.New(retentionprom.Options{})\nsweep, _ := retention.New(kv, retention.Config{Prefix: \"runs/\", ..., Observer: c})\n", true},
		{"retention_markers_total{outcome}        counter: markers handled, by outcome\n", false},
		{"retention.markers          counter {marker}, by retention.outcome: markers handled\n", false},
		{"go run ./examples/quickstart\n", false},
	}
	for _, tt := range tests {
		if got := looksLikeGo(tt.text); got != tt.want {
			t.Errorf("looksLikeGo(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// TestRetryDocsSayAttemptsAreKept: the retry key keeps the entity's finish
// time and its attempts (TestAttemptsSurviveRestart), so no doc may say a
// rescheduled marker loses its finish time or that a restart starts an id
// again at RetryDelay.
func TestRetryDocsSayAttemptsAreKept(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("config.go")
	require.NoError(t, err)
	doc := flatDoc(string(src))
	retrySrc, err := os.ReadFile("retry.go")
	require.NoError(t, err)
	for file, stale := range map[string]string{
		"config.go: Config.RetryDelay":  "The rescheduled marker no longer records the entity's finish time",
		"config.go: Config.RetryDelay ": "The count of failures behind a wait lives in memory: after a restart an id starts again at RetryDelay",
		"retry.go: retries":             "a restart forgets it, and an id then starts again at the first delay",
	} {
		text := doc
		if strings.HasPrefix(file, "retry.go") {
			text = flatDoc(string(retrySrc))
		}
		assert.False(t, strings.Contains(text, stale), "%s still says %q", file, stale)
	}
}

// flatDoc joins source text into one line of words, without comment
// markers, so that a sentence can be found across line breaks.
func flatDoc(src string) string {
	var words []string
	for _, w := range strings.Fields(src) {
		if w != "//" {
			words = append(words, w)
		}
	}
	return strings.Join(words, " ")
}
