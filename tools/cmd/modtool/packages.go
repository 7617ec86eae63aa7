package main

import (
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// importablePackages returns the import paths of the packages of the module
// in dir that another module can import: not main, not internal, not under
// testdata, nested modules or folders the go command ignores.
func importablePackages(dir, modPath string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if p != dir {
			if name == "testdata" || name == "vendor" || name == "internal" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return err
		}
		for _, e := range entries {
			n := e.Name()
			if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p, n), nil, parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			if f.Name.Name == "main" || f.Name.Name == "documentation" {
				return nil
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			out = append(out, path.Join(modPath, filepath.ToSlash(rel)))
			return nil
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}
