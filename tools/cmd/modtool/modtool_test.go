package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

func TestPublished(t *testing.T) {
	for dir, want := range map[string]bool{
		".": true, "boltkv": true, "retentionprom": true,
		"examples/bolt": false, "examples": false, "bench": false, "tools": false,
		"benchmarks": true, "examplesx": true,
	} {
		if got := published(dir); got != want {
			t.Errorf("published(%q) = %v, want %v", dir, got, want)
		}
	}
}

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// oldLayout is the layout before publishing: v0.0.0 and replace directives.
func oldLayout(t *testing.T) string {
	root := t.TempDir()
	write(t, root, map[string]string{
		"go.work": "go 1.25.0\n\nuse (\n\t.\n\t./kva\n\t./examples/demo\n)\n",
		"go.mod":  "module github.com/marksweep/retention\n\ngo 1.25.0\n",
		"LICENSE": "license text\n",
		"core.go": "package retention\n",
		"kva/go.mod": "module github.com/marksweep/retention/kva\n\ngo 1.25.0\n\n" +
			"require github.com/marksweep/retention v0.0.0\n\nreplace github.com/marksweep/retention => ../\n",
		"kva/kva.go":          "package kva\n",
		"kva/internal/x/x.go": "package x\n",
		"examples/demo/go.mod": "module github.com/marksweep/retention/examples/demo\n\ngo 1.25.0\n\n" +
			"require (\n\tgithub.com/marksweep/retention v0.0.0\n\tgithub.com/marksweep/retention/kva v0.0.0\n)\n\n" +
			"replace (\n\tgithub.com/marksweep/retention => ../../\n\tgithub.com/marksweep/retention/kva => ../../kva\n)\n",
		"examples/demo/main.go": "package main\n\nfunc main() {}\n",
	})
	return root
}

func TestSetVersionFixesTheLayout(t *testing.T) {
	root := oldLayout(t)
	ws, err := loadWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	if problems := ws.Check(); len(problems) < 2 {
		t.Fatalf("Check() = %q, want the replaces reported", problems)
	}
	changed, err := ws.SetVersion("v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"kva/go.mod", "examples/demo/go.mod", "go.work"}; !slices.Equal(changed, want) {
		t.Errorf("SetVersion changed %q, want %q", changed, want)
	}
	ws, err = loadWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	if problems := ws.Check(); len(problems) != 0 {
		t.Errorf("Check() after SetVersion = %q, want none", problems)
	}
	if v, err := ws.Version(); v != "v0.1.0" || err != nil {
		t.Errorf("Version() = %q, %v, want v0.1.0", v, err)
	}
	work, _ := os.ReadFile(filepath.Join(root, "go.work"))
	for _, line := range []string{"github.com/marksweep/retention v0.1.0 => ./\n", "github.com/marksweep/retention/kva v0.1.0 => ./kva\n"} {
		if !strings.Contains(string(work), line) {
			t.Errorf("go.work lacks %q:\n%s", line, work)
		}
	}
	if strings.Contains(string(work), "examples/demo v0.1.0") {
		t.Errorf("go.work replaces the unpublished example:\n%s", work)
	}
	if changed, err := ws.SetVersion("v0.1.0"); err != nil || len(changed) != 0 {
		t.Errorf("second SetVersion changed %q, %v; want nothing", changed, err)
	}
}

func TestProxyFromDir(t *testing.T) {
	root := oldLayout(t)
	ws, err := loadWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.SetVersion("v0.2.0"); err != nil {
		t.Fatal(err)
	}
	if ws, err = loadWorkspace(root); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := writeProxy(ws, out, "v0.2.0", ""); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]string{
		"github.com/marksweep/retention":     {"LICENSE", "core.go", "go.mod", "go.work"},
		"github.com/marksweep/retention/kva": {"LICENSE", "go.mod", "internal/x/x.go", "kva.go"},
	} {
		mv := module.Version{Path: path, Version: "v0.2.0"}
		dir := filepath.Join(out, filepath.FromSlash(path), "@v")
		cf, err := modzip.CheckZip(mv, filepath.Join(dir, "v0.2.0.zip"))
		if err != nil {
			t.Fatalf("CheckZip(%s) = %v", path, err)
		}
		var got []string
		for _, name := range cf.Valid {
			got = append(got, strings.TrimPrefix(name, mv.String()+"/"))
		}
		if slices.Sort(got); !slices.Equal(got, want) {
			t.Errorf("zip of %s holds %q, want %q", path, got, want)
		}
		if list, _ := os.ReadFile(filepath.Join(dir, "list")); string(list) != "v0.2.0\n" {
			t.Errorf("%s list = %q", path, list)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "github.com/marksweep/retention/examples")); err == nil {
		t.Error("the proxy serves an example module")
	}
	pkgs, err := importablePackages(filepath.Join(root, "kva"), "github.com/marksweep/retention/kva")
	if err != nil || !slices.Equal(pkgs, []string{"github.com/marksweep/retention/kva"}) {
		t.Errorf("importablePackages(kva) = %q, %v; want kva only (no internal)", pkgs, err)
	}
}

func TestVersionIgnoresThePlaceholderOfANewModule(t *testing.T) {
	root := oldLayout(t)
	ws, err := loadWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.SetVersion("v0.3.0"); err != nil {
		t.Fatal(err)
	}
	write(t, root, map[string]string{
		"newmod/go.mod": "module github.com/marksweep/retention/newmod\n\ngo 1.25.0\n\n" +
			"require github.com/marksweep/retention v0.0.0\n\nreplace github.com/marksweep/retention => ../\n",
		"go.work": "go 1.25.0\n\nuse (\n\t.\n\t./kva\n\t./newmod\n\t./examples/demo\n)\n",
	})
	if ws, err = loadWorkspace(root); err != nil {
		t.Fatal(err)
	}
	if v, err := ws.Version(); v != "v0.3.0" || err != nil {
		t.Errorf("Version() = %q, %v, want v0.3.0", v, err)
	}
	if problems := ws.Check(); len(problems) == 0 {
		t.Error("Check() accepts a new module with v0.0.0 and replace")
	}
	for _, bad := range []string{"", "v0.0.0", "0.1.0", "v2.0.0", "v0.1"} {
		if _, err := ws.SetVersion(bad); err == nil {
			t.Errorf("SetVersion(%q) = nil error", bad)
		}
	}
	if _, err := ws.SetVersion("v0.3.0"); err != nil {
		t.Fatal(err)
	}
	if ws, err = loadWorkspace(root); err != nil {
		t.Fatal(err)
	}
	if problems := ws.Check(); len(problems) != 0 {
		t.Errorf("Check() after SetVersion = %q, want none", problems)
	}
}

// A replace of any module in a published go.mod is ignored by Go when a user
// requires that module, so the build the repository tests is not the one
// users get: Check reports it, whatever module it replaces.
func TestCheckRefusesAnyReplaceInAPublishedModule(t *testing.T) {
	root := oldLayout(t)
	ws, err := loadWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.SetVersion("v0.1.0"); err != nil {
		t.Fatal(err)
	}
	kva := "module github.com/marksweep/retention/kva\n\ngo 1.25.0\n\n" +
		"require (\n\tgithub.com/marksweep/retention v0.1.0\n\texample.com/dep v1.0.0\n)\n\n" +
		"replace example.com/dep => example.com/fork v1.0.1\n"
	demo, err := os.ReadFile(filepath.Join(root, "examples/demo/go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, root, map[string]string{
		"kva/go.mod":           kva,
		"examples/demo/go.mod": string(demo) + "\nreplace example.com/other => ../other\n",
	})
	if ws, err = loadWorkspace(root); err != nil {
		t.Fatal(err)
	}
	problems := ws.Check()
	if len(problems) != 1 || !strings.Contains(problems[0], "kva/go.mod replaces example.com/dep") {
		t.Errorf("Check() = %q, want the replace of kva reported, and not the example's", problems)
	}
}

// A module folder that go.work does not use is neither tested in the
// workspace nor tagged, and the core's zip leaves it out: Check reports it.
func TestCheckReportsAModuleOutsideGoWork(t *testing.T) {
	root := oldLayout(t)
	ws, err := loadWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.SetVersion("v0.1.0"); err != nil {
		t.Fatal(err)
	}
	write(t, root, map[string]string{
		"kvb/go.mod":                "module github.com/marksweep/retention/kvb\n\ngo 1.25.0\n",
		"kvb/kvb.go":                "package kvb\n",
		"kva/testdata/mod/go.mod":   "module example.com/fixture\n",
		".hidden/go.mod":            "module example.com/hidden\n",
		"kva/internal/_skip/go.mod": "module example.com/skip\n",
	})
	if ws, err = loadWorkspace(root); err != nil {
		t.Fatal(err)
	}
	problems := ws.Check()
	if len(problems) != 1 || !strings.Contains(problems[0], "kvb/go.mod") {
		t.Errorf("Check() = %q, want kvb/go.mod reported, and nothing else", problems)
	}
}
