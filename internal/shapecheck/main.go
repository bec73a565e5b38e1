// Command shapecheck reports the places where the code outgrows the shape
// the project holds itself to: production files over 600 lines, functions
// over 100 lines, types with more than 25 methods, and production files
// under pkg/ that import the module's internal/ packages (a package others
// may import must not depend on one they cannot). `make lint` runs it; it
// exits 1 when it finds any.
//
//	go run ./internal/shapecheck [dir]
package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

const (
	maxFileLines = 600
	maxFuncLines = 100
	maxMethods   = 25
)

// exempt names the types allowed past maxMethods: the subject-name table is
// one method per subject by design.
var exempt = map[string]bool{"protocol.Names": true}

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	problems, err := check(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shapecheck:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

func check(root string) ([]string, error) {
	var problems []string
	methods := map[string]int{}
	fset := token.NewFileSet()
	internal, err := internalPrefix(root)
	if err != nil {
		return nil, err
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", ".tools", "testdata", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		problems = append(problems, internalImports(root, path, f, internal)...)
		if n := fset.Position(f.End()).Line; n > maxFileLines {
			problems = append(problems, fmt.Sprintf("%s: %d lines (at most %d)", path, n, maxFileLines))
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			name := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) > 0 {
				recv := recvName(fn.Recv.List[0].Type)
				name = recv + "." + name
				methods[f.Name.Name+"."+recv]++
			}
			if lines > maxFuncLines {
				problems = append(problems, fmt.Sprintf("%s: func %s is %d lines (at most %d)", fset.Position(fn.Pos()), name, lines, maxFuncLines))
			}
		}
		return nil
	})
	keys := make([]string, 0, len(methods))
	for k := range methods {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if methods[k] > maxMethods && !exempt[k] {
			problems = append(problems, fmt.Sprintf("type %s has %d methods (at most %d)", k, methods[k], maxMethods))
		}
	}
	return problems, err
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// internalPrefix is the import path prefix of the module's internal
// packages, read from root's go.mod ("" when root holds no go.mod).
func internalPrefix(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		if mod, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(mod), `"`) + "/internal/", nil
		}
	}
	return "", fmt.Errorf("%s: no module line", filepath.Join(root, "go.mod"))
}

// internalImports reports the imports of prefix's packages by f, a
// production file at path, when path is under root's pkg/.
func internalImports(root, path string, f *ast.File, prefix string) []string {
	rel, err := filepath.Rel(root, path)
	if prefix == "" || err != nil || !strings.HasPrefix(filepath.ToSlash(rel), "pkg/") {
		return nil
	}
	var problems []string
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, prefix) {
			problems = append(problems, fmt.Sprintf("%s: imports %s (a package under pkg/ imports nothing from internal/)", path, p))
		}
	}
	return problems
}
