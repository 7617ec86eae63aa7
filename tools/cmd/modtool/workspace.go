package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// corePath is the module every published module builds on.
const corePath = "github.com/marksweep/retention"

// placeholder is the version a module requires ours at while a replace
// directive ties them; it is never released.
const placeholder = "v0.0.0"

// A Module is one module of the workspace, as go.work uses it.
type Module struct {
	Dir       string // relative to the repository root, slash-separated, "." for the core
	Path      string // module path
	Published bool   // tagged by scripts/release and importable by users
	File      *modfile.File
}

// published reports whether the module in dir (relative to the repository
// root) is one users import. The examples, the benchmarks and these tools are
// not: they are built from a checkout, in the workspace, and never tagged.
// Every other module is, so a new module is published by being added to
// go.work unless it lives under one of these folders.
func published(dir string) bool {
	for _, p := range []string{"examples", "bench", "tools"} {
		if dir == p || strings.HasPrefix(dir, p+"/") {
			return false
		}
	}
	return true
}

// A Workspace is the repository's go.work and the modules it uses.
type Workspace struct {
	Root    string
	Work    *modfile.WorkFile
	Modules []*Module // in go.work order
}

func loadWorkspace(root string) (*Workspace, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	ws := &Workspace{Root: root, Work: wf}
	for _, u := range wf.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		if filepath.IsAbs(u.Path) || dir == ".." || strings.HasPrefix(dir, "../") {
			return nil, fmt.Errorf("go.work: use %s is outside the repository", u.Path)
		}
		name := filepath.Join(root, filepath.FromSlash(dir), "go.mod")
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			return nil, err
		}
		if f.Module == nil {
			return nil, fmt.Errorf("%s: no module line", name)
		}
		ws.Modules = append(ws.Modules, &Module{
			Dir:       dir,
			Path:      f.Module.Mod.Path,
			Published: published(dir),
			File:      f,
		})
	}
	core := ws.module(corePath)
	if core == nil || core.Dir != "." {
		return nil, fmt.Errorf("go.work does not use the core module %s at the repository root", corePath)
	}
	return ws, nil
}

func (ws *Workspace) module(path string) *Module {
	for _, m := range ws.Modules {
		if m.Path == path {
			return m
		}
	}
	return nil
}

// Published returns the published modules, the core first.
func (ws *Workspace) Published() []*Module {
	var out []*Module
	for _, m := range ws.Modules {
		if m.Published {
			out = append(out, m)
		}
	}
	slices.SortStableFunc(out, func(a, b *Module) int {
		if a.Path == corePath {
			return -1
		}
		if b.Path == corePath {
			return 1
		}
		return strings.Compare(a.Path, b.Path)
	})
	return out
}

// isPublished reports whether path names a published module of the workspace.
func (ws *Workspace) isPublished(path string) bool {
	m := ws.module(path)
	return m != nil && m.Published
}

// ours reports whether path is the core's or below it: a module of this
// repository, whether or not the workspace uses it.
func ours(path string) bool {
	return path == corePath || strings.HasPrefix(path, corePath+"/")
}

// Version returns the one version at which the workspace's modules require
// the published modules. It is an error if they disagree or none requires any.
func (ws *Workspace) Version() (string, error) {
	seen := map[string][]string{} // version -> "module requires path"
	for _, m := range ws.Modules {
		for _, r := range m.File.Require {
			if ws.isPublished(r.Mod.Path) {
				seen[r.Mod.Version] = append(seen[r.Mod.Version], m.Path+" requires "+r.Mod.Path)
			}
		}
	}
	// v0.0.0 is the placeholder of a module added with replace directives
	// (see docs/development.md's recipe), not a version of ours.
	if len(seen) > 1 {
		delete(seen, placeholder)
	}
	switch len(seen) {
	case 0:
		return "", fmt.Errorf("no module of go.work requires a published module, so there is no current version")
	case 1:
		for v := range seen {
			return v, nil
		}
	}
	var b strings.Builder
	b.WriteString("the modules require the published modules at different versions:")
	for _, v := range slices.Sorted(maps.Keys(seen)) {
		fmt.Fprintf(&b, "\n  %s: %s", v, strings.Join(seen[v], ", "))
	}
	return "", fmt.Errorf("%s", b.String())
}

// Check returns every way the layout differs from the one that publishes:
// no module replaces one of ours and no published module replaces any (a
// replace in a dependency's go.mod is ignored by Go, so it would hide a
// broken requirement), all requirements on
// published modules name one version, and go.work replaces exactly each
// published module at that version by its folder, so that the workspace
// builds before that version exists anywhere.
func (ws *Workspace) Check() []string {
	var problems []string
	for _, m := range ws.Modules {
		for _, r := range m.File.Replace {
			switch {
			case ours(r.Old.Path):
				problems = append(problems, fmt.Sprintf("%s/go.mod replaces %s: remove it, go.work ties the modules together", m.Dir, r.Old.Path))
			case m.Published:
				problems = append(problems, fmt.Sprintf("%s/go.mod replaces %s: Go ignores it where users require %s, "+
					"so they would build with another version than the one tested; require a version that works instead", m.Dir, r.Old.Path, m.Path))
			}
		}
		for _, r := range m.File.Require {
			if ours(r.Mod.Path) && !ws.isPublished(r.Mod.Path) {
				problems = append(problems, fmt.Sprintf("%s/go.mod requires %s, which is not a published module of go.work", m.Dir, r.Mod.Path))
			}
		}
	}
	unused, err := ws.unusedModules()
	if err != nil {
		return append(problems, err.Error())
	}
	for _, dir := range unused {
		problems = append(problems, fmt.Sprintf("%s/go.mod is not used by go.work: it is neither tested in the workspace nor released; go work use ./%s", dir, dir))
	}
	v, err := ws.Version()
	if err != nil {
		return append(problems, err.Error())
	}
	for _, m := range ws.Modules {
		for _, r := range m.File.Require {
			if ws.isPublished(r.Mod.Path) && r.Mod.Version != v {
				problems = append(problems, fmt.Sprintf("%s/go.mod requires %s %s, want %s", m.Dir, r.Mod.Path, r.Mod.Version, v))
			}
		}
	}
	want := map[string]string{}
	for _, m := range ws.Published() {
		want[m.Path] = "./" + m.Dir
		if m.Dir == "." {
			want[m.Path] = "./"
		}
	}
	for _, r := range ws.Work.Replace {
		if !ours(r.Old.Path) {
			continue
		}
		dir, ok := want[r.Old.Path]
		if !ok || r.Old.Version != v || path.Clean(r.New.Path) != path.Clean(dir) || r.New.Version != "" {
			problems = append(problems, fmt.Sprintf("go.work: unexpected replace %s %s => %s", r.Old.Path, r.Old.Version, r.New.Path))
			continue
		}
		delete(want, r.Old.Path)
	}
	for _, p := range slices.Sorted(maps.Keys(want)) {
		problems = append(problems, fmt.Sprintf("go.work lacks: replace %s %s => %s", p, v, want[p]))
	}
	return problems
}

// unusedModules returns the folders, relative to the root, that hold a
// go.mod go.work does not use; testdata and the folders the go command
// ignores (. and _ names) are not searched.
func (ws *Workspace) unusedModules() ([]string, error) {
	used := map[string]bool{}
	for _, m := range ws.Modules {
		used[m.Dir] = true
	}
	var out []string
	err := filepath.WalkDir(ws.Root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != ws.Root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		rel, err := filepath.Rel(ws.Root, filepath.Dir(p))
		if err != nil {
			return err
		}
		if dir := filepath.ToSlash(rel); !used[dir] {
			out = append(out, dir)
		}
		return nil
	})
	return out, err
}

const workReplaceComment = `// The modules require each other at the version being prepared, which may
// not be tagged yet: these lines let the workspace build without fetching
// it. Kept by scripts/modtool setversion (scripts/release runs it).
`

// SetVersion makes every requirement on a published module name version,
// drops every replace of one of our modules from the go.mod files, and sets
// go.work's replaces to the published modules at version. It writes only the
// files that change and returns their names.
func (ws *Workspace) SetVersion(version string) ([]string, error) {
	if err := checkVersion(version); err != nil {
		return nil, err
	}
	var changed []string
	for _, m := range ws.Modules {
		f := m.File
		before, err := f.Format()
		if err != nil {
			return nil, err
		}
		for _, r := range slices.Clone(f.Require) {
			if ws.isPublished(r.Mod.Path) && r.Mod.Version != version {
				if err := f.AddRequire(r.Mod.Path, version); err != nil {
					return nil, err
				}
			}
		}
		for _, r := range slices.Clone(f.Replace) {
			if ours(r.Old.Path) {
				if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return nil, err
				}
			}
		}
		f.Cleanup()
		after, err := f.Format()
		if err != nil {
			return nil, err
		}
		if string(after) != string(before) {
			name := filepath.Join(m.Dir, "go.mod")
			if err := os.WriteFile(filepath.Join(ws.Root, name), after, 0o644); err != nil {
				return nil, err
			}
			changed = append(changed, filepath.ToSlash(name))
		}
	}

	wf := ws.Work
	before := modfile.Format(wf.Syntax)
	for _, r := range slices.Clone(wf.Replace) {
		if ours(r.Old.Path) {
			if err := wf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return nil, err
			}
		}
	}
	wf.Cleanup()
	// One block, with the reason, rather than the line per replace that
	// WorkFile.AddReplace writes.
	var b strings.Builder
	b.Write(bytes.TrimRight(modfile.Format(wf.Syntax), "\n"))
	b.WriteString("\n\n" + workReplaceComment + "replace (\n")
	for _, m := range ws.Published() {
		dir := "./" + m.Dir
		if m.Dir == "." {
			dir = "./"
		}
		fmt.Fprintf(&b, "\t%s %s => %s\n", m.Path, version, dir)
	}
	b.WriteString(")\n")
	after := []byte(b.String())
	if _, err := modfile.ParseWork("go.work", after, nil); err != nil {
		return nil, err
	}
	if string(after) != string(before) {
		if err := os.WriteFile(filepath.Join(ws.Root, "go.work"), after, 0o644); err != nil {
			return nil, err
		}
		changed = append(changed, "go.work")
	}
	return changed, nil
}

// checkVersion refuses what cannot be a release of these modules.
func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("version %q is not a semantic version such as v0.1.0", v)
	}
	if v == placeholder {
		return fmt.Errorf("version %s is the placeholder of a replace, not a release", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		return fmt.Errorf("version %s needs /%s module paths, which these modules do not have", v, m)
	}
	return nil
}
