package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// writeProxy writes, under out, a module proxy in the layout GOPROXY=file://
// reads (the same as $GOMODCACHE/cache/download): for every published module,
// @v/list, VERSION.info, VERSION.mod and VERSION.zip.
//
// With rev empty the modules come from the working tree, as they are on disk;
// otherwise from that git revision, exactly as a module proxy builds them from
// a tag. A subdirectory module without a LICENSE gets the repository's, as
// the go command does when it fetches from version control.
func writeProxy(ws *Workspace, out, version, rev string) error {
	if err := checkVersion(version); err != nil {
		return err
	}
	when := time.Now().UTC()
	if rev != "" {
		t, err := commitTime(ws.Root, rev)
		if err != nil {
			return err
		}
		when = t
	}
	for _, m := range ws.Published() {
		mv := module.Version{Path: m.Path, Version: version}
		if err := module.Check(m.Path, version); err != nil {
			return err
		}
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			return err
		}
		dir := filepath.Join(out, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var zipBuf bytes.Buffer
		var gomod []byte
		subdir := m.Dir
		if subdir == "." {
			subdir = ""
		}
		if rev != "" {
			if err := modzip.CreateFromVCS(&zipBuf, mv, ws.Root, rev, subdir); err != nil {
				return err
			}
			gomod, err = gitShow(ws.Root, rev, filepath.ToSlash(filepath.Join(m.Dir, "go.mod")))
			if err != nil {
				return err
			}
		} else {
			src := filepath.Join(ws.Root, filepath.FromSlash(m.Dir))
			files, err := dirFiles(ws.Root, src)
			if err != nil {
				return err
			}
			if err := modzip.Create(&zipBuf, mv, files); err != nil {
				return fmt.Errorf("zip %s: %w", src, err)
			}
			gomod, err = os.ReadFile(filepath.Join(src, "go.mod"))
			if err != nil {
				return err
			}
		}
		info, err := json.Marshal(struct {
			Version string
			Time    time.Time
		}{version, when})
		if err != nil {
			return err
		}
		for name, data := range map[string][]byte{
			version + ".zip":  zipBuf.Bytes(),
			version + ".mod":  gomod,
			version + ".info": info,
			"list":            []byte(version + "\n"),
		} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// dirFiles lists the files of the module in src as zip.CreateFromDir would
// (it leaves out nested modules, vendor and VCS folders when the zip is
// made), adding the repository's LICENSE to a subdirectory module that has
// none.
func dirFiles(root, src string) ([]modzip.File, error) {
	var files []modzip.File
	haveLicense := false
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		slash := filepath.ToSlash(rel)
		if info.IsDir() {
			if p == src {
				return nil
			}
			switch filepath.Base(p) {
			case ".git", ".hg", ".svn", ".bzr":
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if slash == "LICENSE" {
			haveLicense = true
		}
		files = append(files, diskFile{slash: slash, path: p, info: info})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !haveLicense && src != root {
		p := filepath.Join(root, "LICENSE")
		if info, err := os.Lstat(p); err == nil {
			files = append(files, diskFile{slash: "LICENSE", path: p, info: info})
		}
	}
	return files, nil
}

type diskFile struct {
	slash string
	path  string
	info  os.FileInfo
}

func (f diskFile) Path() string                 { return f.slash }
func (f diskFile) Lstat() (os.FileInfo, error)  { return f.info, nil }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.path) }

func gitShow(root, rev, name string) ([]byte, error) {
	cmd := exec.Command("git", "show", rev+":"+name)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git show %s:%s: %v: %s", rev, name, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func commitTime(root, rev string) (time.Time, error) {
	cmd := exec.Command("git", "log", "-1", "--format=%cI", rev)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return time.Time{}, fmt.Errorf("git log %s: %v", rev, err)
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(out)))
	return t.UTC(), err
}
