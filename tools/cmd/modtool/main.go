// Command modtool keeps the repository's multi-module layout publishable
// and builds a local module proxy from it. scripts/release,
// scripts/consumer-test and scripts/tidy run it; run it from the tools
// folder with GOWORK=off (scripts/modtool does).
//
//	modtool [-C root] modules            the go.work modules: dir, path, published or not
//	modtool [-C root] packages           module path and import path of each package users can import
//	modtool [-C root] version            the version every module requires the published modules at
//	modtool [-C root] check              report a layout that would not publish; exit 1 if any
//	modtool [-C root] setversion [VERSION]
//	                                     require the published modules at VERSION (default: the
//	                                     current version, v0.0.0 placeholders aside) everywhere
//	modtool [-C root] proxy [-version V] [-rev REV] DIR
//	                                     write a GOPROXY=file:// proxy holding every published module
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	root := flag.String("C", ".", "repository root (the folder holding go.work)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: modtool [-C root] modules|packages|version|check|setversion [VERSION]|proxy [-version V] [-rev REV] DIR")
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	abs, err := filepath.Abs(*root)
	if err != nil {
		fatal(err)
	}
	ws, err := loadWorkspace(abs)
	if err != nil {
		fatal(err)
	}
	args := flag.Args()[1:]
	switch flag.Arg(0) {
	case "modules":
		for _, m := range ws.Modules {
			state := "unpublished"
			if m.Published {
				state = "published"
			}
			fmt.Printf("%s\t%s\t%s\n", m.Dir, m.Path, state)
		}
	case "packages":
		for _, m := range ws.Published() {
			pkgs, err := importablePackages(filepath.Join(ws.Root, filepath.FromSlash(m.Dir)), m.Path)
			if err != nil {
				fatal(err)
			}
			for _, p := range pkgs {
				fmt.Printf("%s\t%s\n", m.Path, p)
			}
		}
	case "version":
		v, err := ws.Version()
		if err != nil {
			fatal(err)
		}
		fmt.Println(v)
	case "check":
		if problems := ws.Check(); len(problems) > 0 {
			fmt.Fprintln(os.Stderr, "modtool: the module layout would not publish:\n  "+strings.Join(problems, "\n  "))
			fmt.Fprintln(os.Stderr, "modtool: scripts/modtool setversion fixes the go.mod and go.work lines")
			os.Exit(1)
		}
	case "setversion":
		var version string
		switch len(args) {
		case 0:
			if version, err = ws.Version(); err != nil {
				fatal(err)
			}
		case 1:
			version = args[0]
		default:
			flag.Usage()
			os.Exit(2)
		}
		changed, err := ws.SetVersion(version)
		if err != nil {
			fatal(err)
		}
		for _, name := range changed {
			fmt.Println(name)
		}
	case "proxy":
		fs := flag.NewFlagSet("proxy", flag.ExitOnError)
		version := fs.String("version", "", "version to serve (default: the one the modules require)")
		rev := fs.String("rev", "", "git revision to zip (default: the working tree)")
		fs.Parse(args)
		if fs.NArg() != 1 {
			flag.Usage()
			os.Exit(2)
		}
		if *version == "" {
			if *version, err = ws.Version(); err != nil {
				fatal(err)
			}
		}
		if err := writeProxy(ws, fs.Arg(0), *version, *rev); err != nil {
			fatal(err)
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "modtool:", err)
	os.Exit(1)
}
